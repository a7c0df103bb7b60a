"""Past one GPU per model, measured at the Qwen3-8B shape on one H200: sharded drafters
(drafter.parallel), staged targets (target.stages) and checkpoint saves.

    python -m bench.h200_parallel --out docs/bench            # everything
    python -m bench.h200_parallel --parts drafter --out /tmp/b  # a subset; keys merge

Parts (each adds its keys to <out>/h200_parallel.json, so parts may run in separate calls):

* ``drafter``: the co-located pipeline (cluster=one_gpu, shape A: 4 x 800 tokens, 256
  anchors) with the Qwen3-8B recipe's drafter replicated and under FSDP2 at world size 1,
  both eager with SDPA (FSDP refuses compiled drafters): ``replicate_samples_per_s``,
  ``fsdp_samples_per_s``, and the drafter's peak memory ``*_peak_mem_gb``.
* ``stages``: a random-weight Qwen3-8B-shape target whole and in 2 stages sharing the GPU
  (bench/scale/stages.py): ``whole_target_samples_per_s``, ``staged_target_samples_per_s``,
  ``staged_taps_max_abs_diff``.
* ``checkpoint``: the pipeline saving every few steps: ``checkpoint_stall_s``, the longest a
  save held the step loop (the driver's "held training" lines), per drafter mode.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from bench.scale.result import failed_parts, open_result, record as _record

PARTS = ("drafter", "stages", "checkpoint")
# Eager on both sides (FSDP refuses compiled drafters), so SDPA: eager flex attention is a
# reference implementation, not a kernel.
MODES = {mode: (f"drafter.parallel={mode}", "drafter.attention=sdpa")
         for mode in ("replicate", "fsdp")}


def _drafter(work: Path, out: Path, steps: int, record) -> None:
    from bench.scale.pipeline import run_pipeline
    for mode, extra in MODES.items():
        run = run_pipeline(work, out, steps=steps, drafter_compile="off", name=mode, extra=extra)
        record(f"pipeline_{mode}", run)
        if "error" not in run:
            record(f"{mode}_samples_per_s", run["samples_per_s"])
            record(f"{mode}_peak_mem_gb", run["drafter_max_mem_gb"])


def _checkpoint(work: Path, out: Path, steps: int, record) -> None:
    from bench.scale.pipeline import run_pipeline
    for mode, extra in MODES.items():
        name = f"ckpt_{mode}"
        run = run_pipeline(work, out, steps=steps, drafter_compile="off", name=name,
                           extra=(*extra, "train.checkpoint.every=10"))
        log = (out / f"pipeline_1gpu_{name}.log").read_text()
        held = [float(x) for x in re.findall(r"held training ([0-9.]+)s", log)]
        record(f"checkpoint_{mode}", {**run, "held_s": held})
        if held:
            record("checkpoint_stall_s" if mode == "replicate" else f"checkpoint_stall_s_{mode}",
                   max(held))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--out", default="runs/bench_parallel")
    p.add_argument("--work", default="/tmp/bench_8b", help="target folder and data (large)")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args(argv)
    from bench.scale.synthetic import build_target
    out, work = Path(args.out), Path(args.work)
    path, result = open_result(out, work, "h200_parallel.json")
    record = lambda key, value: _record(result, path, key, value)  # noqa: E731
    build_target(work / "qwen3-8b-random")
    parts = args.parts.split(",")
    if "drafter" in parts:
        _drafter(work, out, args.steps, record)
    if "stages" in parts:
        from bench.scale.stages import run_stages
        run = run_stages(work)
        record("stages_run", run)
        for key in ("whole_target_samples_per_s", "staged_target_samples_per_s",
                    "staged_taps_max_abs_diff"):
            record(key, run[key])
    if "checkpoint" in parts:
        _checkpoint(work, out, args.steps, record)
    return result


if __name__ == "__main__":
    failed = failed_parts(main())
    if failed:
        raise SystemExit(f"bench.h200_parallel: {', '.join(failed)} failed; see their logs")
