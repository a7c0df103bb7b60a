"""Training checkpoints: atomic folders that hold everything an exact resume needs.

A checkpoint is ``<out_dir>/checkpoints/step_<N>/`` with ``drafter.pt`` (fp32 weights,
optimizer and scheduler state, RNG states; written by drafter rank 0, replicas being
identical) and ``state.json`` (steps done, the data cursor as (epoch, samples done in it)).
It is written under a temporary name and renamed once complete, so a crash never leaves a
half checkpoint that ``train.checkpoint.resume=auto`` could pick. With several nodes the
out_dir must be on a filesystem that drafter rank 0 and the driver share.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from pipeline.training.plan import ResumePoint

_PREFIX = "step_"


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def staging_dir(out_dir: str | Path, step: int) -> Path:
    path = checkpoint_root(out_dir) / f".{_PREFIX}{step:08d}.tmp-{os.getpid()}"
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def finalize(staging: Path, point: ResumePoint, extra: dict) -> Path:
    """Write state.json into the staged folder and rename it into place (atomic)."""
    (staging / "state.json").write_text(json.dumps({**asdict(point), **extra}, indent=2))
    final = staging.parent / f"{_PREFIX}{point.step:08d}"
    if final.exists():
        shutil.rmtree(final)
    os.rename(staging, final)
    return final


def latest(out_dir: str | Path) -> Optional[Path]:
    """The newest complete checkpoint under out_dir, if any."""
    root = checkpoint_root(out_dir)
    if not root.is_dir():
        return None
    done = sorted(p for p in root.iterdir()
                  if p.name.startswith(_PREFIX) and (p / "state.json").exists())
    return done[-1] if done else None


def resolve_resume(resume: Optional[str], out_dir: str | Path) -> Optional[Path]:
    """train.resume: null (fresh), "auto" (latest under out_dir, else fresh), or a path."""
    if resume is None:
        return None
    if resume == "auto":
        return latest(out_dir)
    path = Path(resume)
    if not (path / "state.json").exists() or not (path / "drafter.pt").exists():
        raise ValueError(f"train.checkpoint.resume={resume!r} is not a checkpoint folder "
                         "(state.json and drafter.pt expected); allowed: null, auto, or such "
                         "a folder")
    return path


def read_point(path: Path) -> ResumePoint:
    state = json.loads((path / "state.json").read_text())
    return ResumePoint(step=state["step"], epoch=state["epoch"],
                       samples_done=state["samples_done"])
