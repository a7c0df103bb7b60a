"""The pipeline's runs: ``python -m pipeline.train --config-name smollm2_135m`` with the chain's
overrides (bench/real_model_scale.py) and a variant's, a checkpoint every few steps, stopped
by Ctrl-C at its budget; the checkpoint nearest each mark exported by ``pipeline.export``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from bench.peers_steps.common import Checkpoint, Ctx, Point, pick, steady_rates
from bench.peers_steps.runs import Run
from bench.peers_steps.watch import python, run_watched
from bench.real_model_scale import merge_overrides, trainer_overrides
from bench.real_model_steps import gguf_path
from bench.run_log import jsonl_rows


def command(run: Run, ctx: Ctx) -> list[str]:
    s, w = ctx.scale, ctx.work
    base = trainer_overrides(s.data, gguf_path(s.data, w), str(w.data("train")),
                             str(w.data("humaneval")), str(ctx.run_dir(run)), s.max_steps)
    race = [f"train.checkpoint.every={s.ours_checkpoint_every}", "train.checkpoint.keep_last=0",
            "train.eval.every=-1",
            *((f"train.plan.epochs={s.ours_epochs}",) if s.ours_epochs else ())]
    return python("-m", "pipeline.train", "--config-name", "smollm2_135m",
                  *merge_overrides(base, race, run.overrides))


def points(run_dir: Path) -> list[Point]:
    rows = jsonl_rows(run_dir / "metrics.jsonl")  # polled while the run appends to it
    out, samples, tokens = [], 0.0, 0.0
    for r in rows:
        if "train/samples" not in r:
            continue
        samples += r["train/samples"]
        tokens += r.get("perf/tokens_per_s", 0.0) * r.get("perf/step_time_s", 0.0)
        out.append(Point(int(r["step"]), float(r["time"]), samples, tokens))
    return out


def train(run: Run, ctx: Ctx) -> dict:
    run_dir = ctx.run_dir(run)
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = command(run, ctx)
    budget = ctx.scale.budget_min * 60

    def first_step(_w):
        pts = points(run_dir)
        return pts[0].time if pts else None

    w = run_watched(run.name, cmd, ctx.work.log(run.name), dict(os.environ), first_step,
                    budget, budget + ctx.scale.run_overhead_s * 3)
    pts = points(run_dir)
    times = {p.step: p.time for p in pts}
    ckpts = [Checkpoint(int(d.name.split("_")[1]), times[int(d.name.split("_")[1])], d)
             for d in sorted((run_dir / "checkpoints").glob("step_*"))
             if (d / "state.json").exists() and int(d.name.split("_")[1]) in times]
    marks = _export_marks(run, ctx, pts, ckpts)
    _prune(ckpts, marks)
    return {"command": cmd, "watched": w, "points": pts, "marks": marks}


def _export_marks(run: Run, ctx: Ctx, pts: list[Point], ckpts: list[Checkpoint]) -> list:
    from pipeline.export import export_checkpoint

    marks = []
    for k, mark_s in enumerate(ctx.scale.mark_seconds):
        c = pick(ckpts, pts[0].time, mark_s) if pts else None
        if c is None:
            marks.append(None)
            continue
        out = ctx.export_dir(run, k)
        shutil.rmtree(out, ignore_errors=True)
        export_checkpoint(c.path, out)
        marks.append({"step": c.step, "time": c.time, "dir": str(out),
                      "checkpoint": c.path.name})
    return marks


def _prune(ckpts: list[Checkpoint], marks: list) -> None:
    """The step folders no mark took are removed (one every few steps adds up on the disk)."""
    kept = {m["checkpoint"] for m in marks if m}
    for c in ckpts:
        if c.path.name not in kept:
            shutil.rmtree(c.path, ignore_errors=True)


def rates(result: dict) -> dict:
    return steady_rates(result["points"])
