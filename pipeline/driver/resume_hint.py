"""What an interrupted job (Ctrl-C, SIGTERM) tells its user: where it stopped, and the command
that goes on from there."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

from pipeline import checkpoint as ckpt
from pipeline.config_keys import override_key

RESUME_KEY = "train.checkpoint.resume"
ENTRY = ["python", "-m", "pipeline.train"]


def resume_args(args: list[str], configured: Optional[str]) -> list[str]:
    """``args`` (the command line's overrides) set to resume from the newest checkpoint
    under train.out_dir: an explicit resume override becomes ``auto``, and one is added
    when the config (``configured``) would not resume by itself."""
    out, explicit = [], False
    for arg in args:
        if override_key(arg) == RESUME_KEY:
            out.append(f"{RESUME_KEY}=auto")
            explicit = True
        else:
            out.append(arg)
    if not explicit and configured != "auto":
        out.append(f"{RESUME_KEY}=auto")
    return out


def interrupted_line(out_dir: str | Path, args: list[str], configured: Optional[str],
                     cause: str = "interrupted", known: Optional[Path] = None) -> str:
    """One line: the newest usable checkpoint under ``out_dir`` (or none) and the command
    that resumes from it. ``cause`` opens the line ("interrupted", "stopped by SIGTERM");
    ``known``: the newest checkpoint the job itself verified, not read again when it is still
    the newest folder (hashing a large checkpoint takes seconds that a stopped job may not
    have before SIGKILL)."""
    last = _newest(out_dir, known)
    if last is None and configured not in (None, "auto"):
        # This job started from an explicit checkpoint and wrote none: start there again.
        return (f"{cause}: no checkpoint was written under {out_dir}; the same command "
                f"resumes from {configured} again: {shlex.join(ENTRY + args)}")
    command = shlex.join(ENTRY + resume_args(args, configured))
    if last is None:
        return (f"{cause}: no checkpoint was written under {out_dir}, so a rerun starts "
                f"from step 0: {command}")
    return (f"{cause}: the newest checkpoint is {last} (step {ckpt.read_point(last).step})"
            f"; resume with: {command}")


def _newest(out_dir: str | Path, known: Optional[Path]) -> Optional[Path]:
    folders = ckpt.step_folders(out_dir)
    if known is not None and folders and folders[-1] == Path(known):
        return folders[-1]
    return ckpt.latest(out_dir)
