"""What an interrupted job (Ctrl-C, SIGTERM) tells its user: where it stopped, and the command
that goes on from there, where the job ran: the command line, or for a job that Ray's job
server started (`ray job submit`, stopped by `ray job stop`) its resubmission."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Mapping, Optional

from pipeline import checkpoint as ckpt
from pipeline.checks.config_keys import override_key

RESUME_KEY = "train.checkpoint.resume"
ENTRY = ["python", "-m", "pipeline.train"]
# The README's submission (launch/submit.sh), run from the repository root.
RESUBMIT = ["ray", "job", "submit", "--working-dir", ".", "--runtime-env",
            "launch/runtime_env.yaml", "--"]
# What Ray's job server (2.x, job_supervisor) sets in the environment of a submitted job's
# driver: the job's runtime env and metadata, its submission id among them.
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def submission_id(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The `ray job submit` id ("raysubmit_...") of the job this process drives, or None."""
    try:
        metadata = json.loads(environ.get(RAY_JOB_ENV) or "{}").get("metadata") or {}
        return metadata.get("job_submission_id") or None
    except (ValueError, AttributeError):  # not Ray's JSON: not a submitted job
        return None


def go_on_command(args: list[str], environ: Mapping[str, str] = os.environ) -> str:
    """``python -m pipeline.train args``, as `ray job submit` where the job was submitted."""
    command = shlex.join(ENTRY + args)
    job = submission_id(environ)
    if job is None:
        return command
    # The address and any --env of the submission are not known here (the driver sees the
    # head's own addresses, and the env may hold a key): named, not repeated.
    return (f"{shlex.join(RESUBMIT)} {command} (from the repository root, with the --address "
            f"and --env that submitted {job}; launch/submit.sh -- {shlex.join(args)} does the "
            f"same)")


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
                     cause: str = "interrupted", known: Optional[Path] = None,
                     environ: Mapping[str, str] = os.environ) -> str:
    """One line: the newest usable checkpoint under ``out_dir`` (or none) and the command
    that resumes from it (:func:`go_on_command`). ``cause`` opens the line ("interrupted",
    "stopped by SIGTERM"); ``known``: the newest checkpoint the job itself verified, not read
    again when it is still the newest folder (hashing a large checkpoint takes seconds that a
    stopped job may not have before SIGKILL)."""
    last = _newest(out_dir, known)
    if last is None and configured not in (None, "auto"):
        # This job started from an explicit checkpoint and wrote none: start there again.
        return (f"{cause}: no checkpoint was written under {out_dir}; the same command "
                f"resumes from {configured} again: {go_on_command(args, environ)}")
    command = go_on_command(resume_args(args, configured), environ)
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
