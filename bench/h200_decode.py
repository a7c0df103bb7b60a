"""Decoding at engine speed on one GPU: regeneration and tau evaluation, each beside today's path.

    python -m bench.h200_decode --gguf /path/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --humaneval /path/HumanEval.jsonl.gz --out docs/bench/h200_decode.json --logs DIR
    python -m bench.h200_decode --scale tiny --out /tmp/decode.json --logs /tmp/decode_logs  # CPU

Runs, each in its own process (so one's memory and compiled graphs do not touch the next):
regeneration of the same prompts by the static-cache engine, transformers' continuous batching
and plain ``generate`` (``bench.decode_static``, ``bench.decode_regen``), for SmolLM2-135M-Instruct
(real weights, from its GGUF file through the pipeline's own conversion) and for the Qwen3-8B
shape (random weights); then tau evaluation of 64 prompts x 256 new tokens by the batched
evaluator and by the per-prompt one (``bench.decode_eval``) on both; and the CPU fp32 check
that the two evaluators give the same tau and outputs. The result file gathers each run's
figures under the keys of issue 32 and keeps every sub-result whole under ``runs``.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

# name -> (module, arguments); {folder}, {humaneval} are filled in per scale.
H200 = {
    "smol_static": ("bench.decode_static", "--model {folder} --prompts 512 --max-new-tokens 256 "
                    "--batch 512 --runs static,hf --humaneval {humaneval}"),
    "smol_cb": ("bench.decode_regen", "--model {folder} --prompts 512 --max-new-tokens 256 "
                "--batch 512 --humaneval {humaneval}"),
    "q8b_static": ("bench.decode_static", "--model qwen3_8b_random --prompts 256 "
                   "--max-new-tokens 256 --batch 256 --runs static,hf"),
    "smol_eval": ("bench.decode_eval", "--target {folder} --prompts 64 --max-new-tokens 256 "
                  "--baseline-prompts 8 --batch-size 64 --humaneval {humaneval}"),
    "q8b_eval": ("bench.decode_eval", "--target qwen3_8b_random --prompts 64 "
                 "--max-new-tokens 256 --baseline-prompts 4 --batch-size 64"),
    "cpu_eval_equal": ("bench.decode_eval", "--target builtin:tiny-qwen3 --prompts 6 "
                       "--max-new-tokens 24 --device cpu --dtype float32 --graphs off "
                       "--batch-size 3"),
}
TINY = {
    "smol_static": ("bench.decode_static", "--model {folder} --prompts 6 --max-new-tokens 6 "
                    "--batch 4 --runs static,hf --device cpu --dtype fp32 "
                    "--humaneval {humaneval}"),
    "smol_cb": ("bench.decode_regen", "--model {folder} --prompts 4 --max-new-tokens 6 "
                "--batch 4 --device cpu --dtype float32 --humaneval {humaneval}"),
    "smol_eval": ("bench.decode_eval", "--target {folder} --prompts 4 --max-new-tokens 8 "
                  "--baseline-prompts 2 --batch-size 4 --device cpu --dtype float32 "
                  "--graphs off --block-size 4 --humaneval {humaneval}"),
    "cpu_eval_equal": H200["cpu_eval_equal"],
}
TIMEOUT_S = 300  # per run: one stuck run must leave the others their time


def run_one(name: str, module: str, args: str, logs: Path) -> dict:
    """One sub-bench in its own process; its JSON, or why it gave none."""
    out = logs / f"{name}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", module, *args.split(), "--out", str(out)]
    t0 = time.perf_counter()
    with open(logs / f"{name}.log", "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                                timeout=TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = round(time.perf_counter() - t0, 1)
    log.info("%s: rc %s in %.1f s", name, rc, wall)
    if rc != 0 or not out.exists():
        return {"error": f"{' '.join(cmd[1:])} ended rc {rc} after {wall} s; "
                         f"see {name}.log", "wall_s": wall}
    return {**json.loads(out.read_text()), "wall_s": wall}


def gather(runs: dict) -> dict:
    """The headline figures of issue 32 from the sub-results (None where a run failed)."""
    def pick(name, *path):
        node = runs.get(name, {})
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node

    def model(static, cb, evaluation):
        return {
            "regen_tokens_per_s": pick(static, "runs", "static", "tokens_per_s"),
            "cb_tokens_per_s": pick(cb, "regen_tokens_per_s"),
            "hf_generate_tokens_per_s": pick(static, "runs", "hf", "tokens_per_s"),
            "regen_identical_to_hf_share": pick(static, "runs", "static", "identical_share"),
            "cb_identical_to_hf_share": pick(cb, "identical_share"),
            "eval_seconds": {"batched": pick(evaluation, "batched", "eval_seconds"),
                             "per_prompt": pick(evaluation, "baseline", "eval_seconds")},
            "eval_prompts": {"batched": pick(evaluation, "batched", "prompts"),
                             "per_prompt": pick(evaluation, "baseline", "prompts")},
            "eval_speedup_per_prompt": pick(evaluation, "speedup_per_prompt"),
            "eval_outputs_agree_share": pick(evaluation, "outputs_agree_share"),
            "eval_tau_difference": pick(evaluation, "tau_difference"),
        }

    equal = runs.get("cpu_eval_equal", {})
    return {
        "smollm2_135m": model("smol_static", "smol_cb", "smol_eval"),
        "qwen3_8b_random": model("q8b_static", None, "q8b_eval"),
        "eval_tau_equal": (None if "error" in equal or not equal else
                           equal.get("outputs_agree_share") == 1.0
                           and equal.get("tau_difference") == 0.0),
    }


def prepare_target(args, logs: Path) -> tuple[str, str]:
    """(HF folder, HumanEval file): the GGUF converted by the pipeline's own conversion, or
    at the tiny scale a tiny Llama GGUF and a two-prompt HumanEval-shaped file."""
    from pipeline.assets.gguf import gguf_folder

    gguf, humaneval = args.gguf, args.humaneval
    if args.scale == "tiny":
        from pipeline.assets.tiny_gguf import write_tiny_gguf

        gguf = str(logs / "tiny-llama.gguf")
        write_tiny_gguf(gguf)
        humaneval = str(logs / "humaneval_tiny.jsonl")
        Path(humaneval).write_text("".join(
            json.dumps({"task_id": f"t/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Add {i}.\"\"\"\n"})
            + "\n" for i in range(2)))
    if not gguf or not humaneval:
        raise SystemExit("bench.h200_decode: --gguf and --humaneval are needed at --scale h200")
    return gguf_folder(gguf), humaneval


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", choices=("h200", "tiny"), default="h200")
    p.add_argument("--gguf", default=None, help="SmolLM2-135M-Instruct's GGUF file")
    p.add_argument("--humaneval", default=None, help="HumanEval.jsonl(.gz)")
    p.add_argument("--only", default=None, help="comma-separated subset of the runs")
    p.add_argument("--out", required=True, help="the result JSON")
    p.add_argument("--logs", required=True, help="folder for each run's log and JSON")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    folder, humaneval = prepare_target(args, logs)
    plan = TINY if args.scale == "tiny" else H200
    wanted = args.only.split(",") if args.only else list(plan)
    runs = {}
    for name, (module, line) in plan.items():
        if name not in wanted:
            continue
        runs[name] = run_one(name, module, line.format(folder=folder, humaneval=humaneval), logs)
        # Written after every run: a call cut short still leaves the figures it made.
        result = {"scale": args.scale, "target_folder": folder, **gather(runs),
                  "total_wall_s": round(time.perf_counter() - t0, 1), "runs": runs}
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    failed = [name for name, r in runs.items() if "error" in r]
    if failed:
        log.error("bench.h200_decode: %d run(s) gave no figures: %s (see %s)", len(failed),
                  ", ".join(failed), logs)
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
