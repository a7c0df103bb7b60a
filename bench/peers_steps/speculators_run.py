"""Speculators' runs: its offline data (``speculators prepare-data`` on the pipeline's
tokenization and loss masks, then the hidden-state files of bench/peers_steps/speculators_hs.py),
``python -m speculators.train`` stopped by Ctrl-C at its budget (it saves an ``interrupted``
checkpoint then), each checkpoint it saves copied as it appears (it overwrites an epoch's folder),
and the one nearest each mark converted to z-lab's format (bench/peers_steps/zlab.py).

Its trainer moves the draft to device index ``LOCAL_RANK`` (``model.to(0)``: cuda:0) and has no
CPU path, so on CPU only its data preparation and an untrained ``--dry-run`` checkpoint (which
checks the conversion and the decoder's plumbing) run; the training is skipped with that reason.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from pathlib import Path

from bench.peers_steps.common import Checkpoint, Ctx, Point, pick, steady_rates
from bench.peers_steps.runs import Run
from bench.peers_steps.samples import SampleSet, encoded_samples
from bench.peers_steps.watch import Watched, python, run_watched
from bench.peers_steps.zlab import from_speculators

NEEDS_CUDA = ("speculators 0.9.0's trainer moves the draft to device index LOCAL_RANK "
              "(model.to(0), i.e. cuda:0) and has no CPU path")
_STEP = r"global_step=(\d+)"
_SAVED = r"Checkpoint saved to (\S+)"


def taps(run: Run, target_layers: int) -> list[int]:
    """Speculators' aux layer ids for a run: its flags', else its default [2, n//2, n-3]."""
    o = list(run.overrides)
    if "--target-layer-ids" in o:
        i = o.index("--target-layer-ids") + 1
        out = []
        while i < len(o) and not o[i].startswith("--"):
            out.append(int(o[i]))
            i += 1
        return out
    return [2, target_layers // 2, target_layers - 3]


def num_layers(run: Run) -> int:
    for o in run.overrides:
        if o.startswith("--num-layers="):
            return int(o.split("=", 1)[1])
    return 5  # its default for dflash


def prepare(ctx: Ctx) -> Path:
    """``speculators prepare-data`` on the answers as speculator-format rows (input_ids and
    loss_mask from the pipeline's encoding): its documented path without a render server."""
    from transformers import AutoTokenizer

    root = ctx.work.path("speculators")
    rows_path, dataset = root / "rows.jsonl", root / "dataset"
    if (dataset / "dataset_info.json").exists():
        return dataset
    root.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(ctx.target)
    seq = ctx.scale.data.max_length
    with open(rows_path, "w") as f:
        for row in encoded_samples(tok, str(ctx.work.data("train")), seq,
                                   SampleSet.of(ctx.scale.data)):
            f.write(json.dumps(row) + "\n")
    cmd = python("-m", "speculators", "prepare-data", "--model", ctx.target, "--data",
                 str(rows_path), "--output", str(dataset), "--seq-length", str(seq),
                 "--num-preprocessing-workers", "1")
    _check(cmd, ctx, "speculators_prepare")
    return dataset


def hidden_states(ctx: Ctx, dataset: Path, layers: list[int]) -> Path:
    out = ctx.work.path("speculators", "hs_" + "_".join(map(str, layers)))
    if (out / ".done").exists():
        return out
    cmd = python("-m", "bench.peers_steps.speculators_hs", "--dataset", str(dataset),
                 "--target", ctx.target, "--layers", *map(str, layers), "--out", str(out),
                 "--device", ctx.device)
    _check(cmd, ctx, "speculators_hidden_states")
    (out / ".done").write_text("")
    return out


def _check(cmd: list[str], ctx: Ctx, name: str) -> None:
    log = ctx.work.log(name)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as sink:
        done = subprocess.run(cmd, env=ctx.peers_env, stdout=sink, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[1:4])} failed (exit {done.returncode}); see {log}")


def command(run: Run, ctx: Ctx, dataset: Path, hs: Path, dry_run: bool = False) -> list[str]:
    s = ctx.scale
    full = [str(i) for i in range(num_layers(run))]
    cmd = python("-m", "speculators.train", "--verifier-name-or-path", ctx.target,
                 "--speculator-type", "dflash", "--data-path", str(dataset),
                 "--hidden-states-path", str(hs), "--save-path", str(ctx.run_dir(run) / "ckpt"),
                 "--log-dir", str(ctx.run_dir(run) / "logs"), "--on-missing", "raise",
                 "--total-seq-len", str(s.speculators_seq_len), "--train-data-ratio", "0.99",
                 "--num-workers", str(s.speculators_workers), "--checkpoint-freq", "0.25",
                 "--no-resume-from-checkpoint",
                 # z-lab's format, the decoder and its loaders attend over the whole block;
                 # its default sliding layers are causal inside a block (see the module doc of
                 # bench/peers.py): all layers full attention.
                 "--full-attention-indices", *full, *run.overrides)
    if s.max_steps:
        cmd += ["--max-steps", str(s.max_steps)]
    if dry_run:
        cmd += ["--dry-run"]
    return cmd


def points(w: Watched, mean_tokens: float) -> list[Point]:
    out, tokens = [], 0.0
    for t, m in w.all(_STEP):
        line = m.string
        rate = re.search(r"tokens_per_s=([0-9.e+-]+)", line)
        ms = re.search(r"step_ms=([0-9.e+-]+)", line)
        if rate and ms:
            tokens += float(rate.group(1)) * float(ms.group(1)) / 1000
        out.append(Point(int(m.group(1)) + 1, t, tokens / mean_tokens, tokens))
    return out


def train(run: Run, ctx: Ctx, mean_tokens: float) -> dict:
    dataset = prepare(ctx)
    layers = taps(run, ctx.target_config()["num_hidden_layers"])
    hs = hidden_states(ctx, dataset, layers)
    run_dir = ctx.run_dir(run)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    snaps: list[Checkpoint] = []
    lock = threading.Lock()
    step = [0]

    def on_line(t: float, line: str) -> None:
        m = re.search(_STEP, line)
        if m:
            step[0] = int(m.group(1)) + 1
        m = re.search(_SAVED, line)
        if m:
            src, dst = Path(m.group(1)), run_dir / "snap" / str(len(snaps))
            dst.mkdir(parents=True, exist_ok=True)
            for name in ("config.json", "model.safetensors"):
                if (src / name).exists():
                    shutil.copy2(src / name, dst / name)
            with lock:
                snaps.append(Checkpoint(step[0], t, dst))

    if ctx.device != "cuda":
        return _dry_run(run, ctx, dataset, hs)
    cmd = command(run, ctx, dataset, hs)

    def first_step(w: Watched):
        hit = w.first(_STEP)
        return hit[0] if hit else None

    budget = ctx.scale.budget_min * 60
    w = run_watched(run.name, cmd, ctx.work.log(run.name), ctx.peers_env, first_step, budget,
                    budget + ctx.scale.run_overhead_s * 3, on_line=on_line)
    pts = points(w, mean_tokens)
    marks = []
    for k, mark_s in enumerate(ctx.scale.mark_seconds):
        c = pick(snaps, pts[0].time, mark_s, tolerance_s=30.0 if k == len(
            ctx.scale.mark_seconds) - 1 else 1.0) if pts else None
        marks.append(None if c is None else _convert(run, ctx, c, k))
    return {"command": cmd, "watched": w, "points": pts, "marks": marks}


def _convert(run: Run, ctx: Ctx, c: Checkpoint, k: int) -> dict:
    out = ctx.export_dir(run, k)
    shutil.rmtree(out, ignore_errors=True)
    from_speculators(c.path, out, ctx.target_config()["num_hidden_layers"])
    return {"step": c.step, "time": c.time, "dir": str(out)}


def _dry_run(run: Run, ctx: Ctx, dataset: Path, hs: Path) -> dict:
    """CPU: its untrained checkpoint (``--dry-run``) through the conversion, for the decoder's
    plumbing; the training is skipped (NEEDS_CUDA)."""
    cmd = command(run, ctx, dataset, hs, dry_run=True)
    _check(cmd, ctx, run.name + "_dry_run")
    out = ctx.work.path("exports", run.name, "dry_run")
    shutil.rmtree(out, ignore_errors=True)
    from_speculators(ctx.run_dir(run) / "ckpt", out, ctx.target_config()["num_hidden_layers"])
    return {"command": cmd, "skipped": NEEDS_CUDA, "dry_run_dir": str(out)}


def rates(result: dict) -> dict:
    return steady_rates(result.get("points", []))

