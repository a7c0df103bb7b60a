#!/usr/bin/env bash
# The GPU proof of issue 3, as run on the 2x H200 machine (see docs/GPU_RUN.md):
#   1. the seed's failure: a compiled (reduce-overhead) drafter step in a raw thread, torch 2.11
#   2. the pipeline: 1 target + 1 drafter on different GPUs, CUDA IPC slots, reduce-overhead
# Usage (repo root, Ray importable): OUT=/tmp/out bash bench/gpu_proof.sh [steps]
set -uo pipefail
steps=${1:-200}
out=${OUT:-/tmp/gpu-proof}
mkdir -p "$out"
python3 bench/make_target.py --tokenizer-from "$DFLASH_ASSETS_DIR/target" --out /tmp/qwen3-mid \
  2>&1 | tail -1 | tee "$out/make_target.log"
# Each attention backend once: main-thread steps, then the same compiled step in a raw thread.
for att in sdpa flex; do
  timeout 150 python3 bench/thread_repro.py --target /tmp/qwen3-mid --attention "$att" \
    --cases main+thread 2>&1 | grep -E '^\{' | tee "$out/thread_repro_$att.jsonl"
done
# Train with a backend whose main-thread run recorded CUDA graphs (flex preferred).
attention=sdpa
grep -q '"graphs_recorded": [1-9]' "$out/thread_repro_flex.jsonl" && attention=flex
echo "training with drafter.attention=$attention" | tee "$out/choice.txt"
rm -rf /tmp/run-gpu  # a fresh run: pipeline.train resumes a folder that holds checkpoints
timeout 240 python3 -m pipeline.train target.path=/tmp/qwen3-mid cluster.device=cuda \
  cluster.drafters_per_node=1 cluster.cpus_per_actor=2 drafter.compile=reduce-overhead \
  drafter.static_shapes=true drafter.attention="$attention" drafter.block_size=16 \
  drafter.num_anchors=32 train.plan.epochs=3 train.plan.max_steps="$steps" train.optim.lr=1e-3 \
  train.log_every=25 train.eval.prompts=4 train.eval.max_new_tokens=64 \
  train.out_dir=/tmp/run-gpu 2>&1 | grep -v -E 'Warning|warnings.warn|Loading weights' \
  | tee "$out/train.log"
cp /tmp/run-gpu/metrics.jsonl "$out/metrics.jsonl"
