"""Throughput at the Qwen3-8B shape on one GPU (or two): drafter, target, slot copy, pipeline.

    python -m bench.h200_qwen3_8b --out /tmp/bench          # everything, JSON to --out
    python -m bench.h200_qwen3_8b --parts drafter,numerics   # a subset

Shapes: A = 4 x 800 tokens with 256 anchors (SpecForge's published shape), B = 3072 tokens
with 512 anchors (the DFlash recipe). The target is a random-weight model with Qwen3-8B's
architecture, saved with save_pretrained and loaded with from_pretrained; the drafter is
Qwen3-8B's DFlash drafter (5 layers, block 16, taps [1, 9, 17, 25, 33]). Figures are printed
as they come and written to <out>/result.json; docs/BENCHMARKS.md explains them.
"""

from __future__ import annotations

import argparse
import logging
import platform
import time
from pathlib import Path

import torch

from bench.scale.result import record as _record

PARTS = ("numerics", "drafter", "target", "slot", "pipeline", "threads")
SHAPE_A = {"n": 4, "seq_len": 800, "num_anchors": 256}
SHAPE_B = {"seq_len": 3072, "num_anchors": 512}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--out", default="runs/bench_8b")
    p.add_argument("--work", default="/tmp/bench_8b", help="target folder and data (large)")
    p.add_argument("--drafter-modes", default="default,reduce-overhead")
    p.add_argument("--shape-b-batches", default="1,2")
    p.add_argument("--pipeline-steps", type=int, default=40)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    result = {"machine": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "python": platform.python_version()}
    if "numerics" in parts:
        from bench.scale.drafter import bf16_vs_fp32_logits
        _record(result, out / "result.json", "numerics_bf16_vs_fp32", bf16_vs_fp32_logits())
    if "drafter" in parts:
        from bench.scale.drafter import run_drafter
        for mode in args.drafter_modes.split(","):
            _record(result, out / "result.json", f"drafter_A_{mode}", run_drafter(**SHAPE_A, compile_mode=mode))
        for n in args.shape_b_batches.split(","):
            _record(result, out / "result.json", f"drafter_B_n{n}",
                    run_drafter(n=int(n), **SHAPE_B, compile_mode="default"))
    if {"target", "pipeline", "threads"} & set(parts):
        from bench.scale.synthetic import build_target
        t0 = time.perf_counter()
        build_target(work / "qwen3-8b-random")
        _record(result, out / "result.json", "target_build_s", time.perf_counter() - t0)
    if "target" in parts:
        from bench.scale.target import run_target
        for compiled in (False, True):
            _record(result, out / "result.json", f"target_A_compile_{compiled}",
                    run_target(work / "qwen3-8b-random", n=4, seq_len=800, compile=compiled))
        _record(result, out / "result.json", "target_B_n1_compile_True",
                run_target(work / "qwen3-8b-random", n=1, seq_len=3072, compile=True))
    if "slot" in parts:
        from bench.scale.slot import run_slot_copy
        _record(result, out / "result.json", "slot_copy_A", run_slot_copy(n=4, seq_len=800))
    if "threads" in parts:
        from bench.scale.threads import run_threads
        _record(result, out / "result.json", "threads_A", run_threads(work / "qwen3-8b-random", **SHAPE_A))
    if "pipeline" in parts:
        from bench.scale.pipeline import run_pipeline
        _record(result, out / "result.json", "pipeline_A_one_gpu",
                run_pipeline(work, out, steps=args.pipeline_steps))
    return result


if __name__ == "__main__":
    main()
