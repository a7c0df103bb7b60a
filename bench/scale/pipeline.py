"""The whole pipeline at shape A on the GPUs lent: `python -m pipeline.train`, as a user runs it.

One GPU: cluster=one_gpu (a target and a drafter actor, half a GPU each, CUDA IPC between
their processes). Two GPUs: one target and one drafter, a GPU each. Samples/s, busy fractions
and slot waits are read back from the run's metrics.jsonl, skipping the compile warm-up.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.scale.synthetic import write_chats


def run_pipeline(work: Path, out: Path, steps: int, skip: int = 10, gpus: int = 1,
                 target_compile: bool = True, drafter_compile: str = "default",
                 name: str = "", extra: tuple[str, ...] = (), target: Path | None = None) -> dict:
    """``name`` tells runs of one shape apart (folder and log); ``extra``: more overrides;
    ``target``: the target folder (default: the random Qwen3-8B under ``work``)."""
    data = write_chats(work / "chats_A.jsonl", count=4 * steps + 64, prompt_words=190,
                       answer_words=590)
    tag = f"{gpus}gpu{'_' + name if name else ''}"
    run_dir = work / f"run_A_{tag}"
    # A fresh run: train.checkpoint.resume=null refuses a folder holding earlier checkpoints.
    shutil.rmtree(run_dir, ignore_errors=True)
    cluster = ["cluster=one_gpu"] if gpus == 1 else [
        "cluster=one_gpu", "cluster.gpus_per_actor=1"]
    cmd = [sys.executable, "-m", "pipeline.train", "--config-name", "qwen3_8b",
           f"target.path={target or work / 'qwen3-8b-random'}", f"data.train_path={data}",
           f"data.heldout_path={data}", "data.max_length=800", "data.micro_batch_size=4",
           "drafter.num_anchors=256", f"target.compile={target_compile}",
           f"drafter.compile={drafter_compile}", *cluster, "logger=none", "train.eval.every=-1",
           "train.checkpoint.every=0", "train.checkpoint.resume=null", "train.plan.epochs=1",
           f"train.plan.max_steps={steps}", "train.log_every=5", f"train.out_dir={run_dir}",
           *extra]
    t0 = time.perf_counter()
    with open(out / f"pipeline_{tag}.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()] \
        if proc.returncode == 0 else []
    # Its checkpoints and export are an 8B drafter's (tens of GB): the next run needs the disk.
    shutil.rmtree(run_dir, ignore_errors=True)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: see pipeline_{tag}.log", "wall_s": wall}
    steady = [r for r in rows if "perf/samples_per_s" in r and r["step"] > skip]
    mean = lambda key: statistics.fmean(r[key] for r in steady)  # noqa: E731
    step_time = sum(r["perf/step_time_s"] for r in steady)
    samples = sum(r["perf/samples_per_s"] * r["perf/step_time_s"] for r in steady)
    return {"gpus": gpus, "steps": len(steady), "samples_per_s": samples / step_time,
            "target_busy": mean("perf/target0_busy"), "drafter_busy": mean("perf/drafter0_busy"),
            "slot_wait_s_per_step": mean("perf/slot_wait_s"),
            "drafter_max_mem_gb": max(r["perf/drafter0_max_mem_gb"] for r in steady),
            "wall_s": wall}
