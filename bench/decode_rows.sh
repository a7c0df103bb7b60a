#!/usr/bin/env bash
# Sustained static-engine decoding of one model at several row counts and decode-step attentions,
# each in its own process (bench.decode_static), then one summary table and one JSON:
#   bash bench/decode_rows.sh MODEL_FOLDER HUMANEVAL OUT_JSON "512:sdpa 2048:flex ..." \
#       [PROMPTS] [MAX_NEW_TOKENS]
# Each run is cut at $RUN_TIMEOUT seconds (default 120). Picks the rows and attention of a regeneration (bench/real_model_scale.py: regen_rows,
# regen_attention). Each run's log is kept beside OUT_JSON.
set -uo pipefail
model=$1 humaneval=$2 out=$3 configs=$4 prompts=${5:-4096} max_new=${6:-192}
logs=$(dirname "$out")/decode_rows
mkdir -p "$logs"
for config in $configs; do
  rows=${config%%:*} attention=${config##*:}
  timeout "${RUN_TIMEOUT:-120}" python3 -m bench.decode_static --device "${DEVICE:-cuda}" --model "$model" --humaneval "$humaneval" --runs "" \
    --sustained-prompts "$prompts" --sustained-batch "$rows" --attention "$attention" \
    --max-new-tokens "$max_new" --out "$logs/${rows}_${attention}.json" \
    >"$logs/${rows}_${attention}.log" 2>&1 || echo "$config: failed, see $logs/${rows}_${attention}.log"
done
python3 - "$logs" "$out" <<'PY'
import json, pathlib, sys
logs, out = pathlib.Path(sys.argv[1]), sys.argv[2]
table = {}
for f in sorted(logs.glob("*.json")):
    s = json.loads(f.read_text()).get("sustained", {})
    t = s.get("timed", {})
    table[f.stem] = {"tokens_per_s": s.get("tokens_per_s"), "wall_s": s.get("wall_s"),
                     "prefill_s": t.get("prefill_s"), "decode_s": t.get("decode_s"),
                     "ms_per_step": t.get("ms_per_step"), "peak_gb": s.get("peak_gb")}
    print(f.stem, {k: round(v, 2) if isinstance(v, float) else v for k, v in table[f.stem].items()})
pathlib.Path(out).write_text(json.dumps(table, indent=1))
PY
