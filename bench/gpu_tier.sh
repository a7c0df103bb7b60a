#!/usr/bin/env bash
# The GPU tier on one machine, in five pytest processes at once, each log kept under $OUT:
#   OUT=/tmp/tier bash bench/gpu_tier.sh [seconds per group, default 480]
# The demo assets are built once first (tests that need them would otherwise build them in
# each process), under $DFLASH_ASSETS_DIR (default /tmp/gpuassets). Groups: the driver and
# FSDP tests (the longest: real Ray jobs), the families, and everything else marked gpu.
# Families and the rest are each dealt round-robin over TIER_SHARDS processes (default 2), so
# five pytest processes share the GPU. A test that ran out of GPU memory there (a neighbour
# process can hold most of an 80 GB card: 55 GiB was seen) runs again alone afterwards, in
# tier_alone.log; out of memory alone still fails. Prints each
# process's last line and exits non-zero when any failed or ran out of time.
# TIER_GROUPS names a subset (e.g. "driver_fsdp rest") where device time is short; the
# tier is green only with all three.
# The GGUF tests need gguf and accelerate, which the GPU machine's image lacks: a tier without
# them would skip those tests and still end green, so it refuses to start instead.
set -uo pipefail
limit=${1:-480}
python3 -c "import gguf, accelerate" 2>/dev/null || {
  echo "gpu_tier: gguf or accelerate is not importable, so the GGUF tests would skip;" \
       "bundle them: ../shared/gpu/bundle gguf accelerate"; exit 2; }
out=${OUT:-/tmp/gpu-tier}
mkdir -p "$out"
export DFLASH_ASSETS_DIR=${DFLASH_ASSETS_DIR:-/tmp/gpuassets}
python3 -c "from pipeline.assets.cache import ensure_tiny_assets; ensure_tiny_assets()" \
  >"$out/assets.log" 2>&1 || { tail -5 "$out/assets.log"; exit 1; }
heavy="tests/gpu/test_driver_gpu.py tests/gpu/test_fsdp_gpu.py"
families="tests/gpu/test_families_gpu.py"
run() {  # log name, pytest arguments...
  local name=$1; shift
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider -rfEs -m gpu "$@" \
    >"$out/tier_$name.log" 2>&1
  echo "rc=$?" >>"$out/tier_$name.log"
}
shards=${TIER_SHARDS:-2}
sharded() {  # group name, pytest arguments: the group's test ids dealt over $shards processes
  local name=$1; shift
  python3 -m pytest -q -p no:cacheprovider --collect-only -m gpu "$@" 2>/dev/null \
    | grep '::' >"$out/ids_$name.txt"
  for ((k = 0; k < shards; k++)); do
    mapfile -t ids < <(awk -v n="$shards" -v k="$k" '(NR - 1) % n == k' "$out/ids_$name.txt")
    [ ${#ids[@]} -gt 0 ] && run "${name}_$k" "${ids[@]}" &
  done
  wait
}
groups=${TIER_GROUPS:-driver_fsdp families rest}
for name in $groups; do  # every name checked before any group starts
  case $name in
  driver_fsdp|families|rest) ;;
  *) echo "TIER_GROUPS: unknown group $name (driver_fsdp, families, rest)"; exit 2 ;;
  esac
done
for name in $groups; do
  case $name in
  driver_fsdp) run driver_fsdp $heavy & ;;
  families) sharded families $families & ;;
  rest) sharded rest tests $(for f in $heavy $families; do echo "--ignore=$f"; done) & ;;
  esac
done
wait
again=()  # the failed tests of every process that ran out of GPU memory
for log in "$out"/tier_*.log; do
  grep -q OutOfMemoryError "$log" || continue
  mapfile -t failed < <(sed -n 's/^FAILED \([^ ]*\).*/\1/p' "$log")
  again+=("${failed[@]}")
done
[ ${#again[@]} -gt 0 ] && run alone "${again[@]}"
status=0
for log in "$out"/tier_*.log; do
  echo "$(basename "$log" .log): $(grep -E 'passed|failed|error|skipped' "$log" | tail -1)" \
       "$(tail -1 "$log")"
  grep -q '^rc=0$' "$log" && continue
  # excused only where every failure ran again alone and passed (no timeout, no error)
  if [ "$(basename "$log")" != tier_alone.log ] && grep -q OutOfMemoryError "$log" \
     && grep -q '^rc=1$' "$log" && ! grep -q '^ERROR ' "$log" \
     && grep -q '^rc=0$' "$out/tier_alone.log" 2>/dev/null; then
    echo "  (its failures passed alone: tier_alone.log)"
    continue
  fi
  status=1
done
for name in $groups; do  # a group whose ids could not be collected ran nothing
  [ "$name" = driver_fsdp ] || [ -s "$out/ids_$name.txt" ] || { echo "$name: no tests collected"; status=1; }
done
exit $status
