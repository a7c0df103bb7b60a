"""Training checkpoints: durable folders that hold everything an exact resume needs.

A checkpoint is ``<out_dir>/checkpoints/step_<N>/`` with

- ``drafter/``: the weights (fp32) and AdamW state in torch.distributed.checkpoint's format,
  written by the drafter ranks (pipeline/checkpoint/sharded.py: each fsdp rank its shards, of
  replicas rank 0), loadable at any world size and in either drafter.parallel mode;
- ``trainer.pt``: scheduler state, steps done and RNG states (the owner's; the same on every
  rank);
- ``state.json``: steps done, the data cursor as (epoch, samples done in it), every file's
  path, size and sha256, the resume contract of pipeline/job/resume_contract.py.

Checkpoints written before DCP hold ``drafter.pt`` (the whole state in one torch.save file)
instead of the first two; they are read as they are (see pipeline/workers/drafter_worker.py
load_checkpoint), at any world size and mode too.

Writing: the drafters write into a staging folder (``.step_<N>.tmp-*``), fsynced; the driver
writes state.json, fsyncs it and the folder, renames the folder into place and fsyncs the
parent. An older folder of the same name is moved aside first and deleted only after the
rename, and ``keep_last`` prunes only after the new folder is in place, so a crash at any
point leaves the previous checkpoint whole. A write that fails (a full disk) removes its
staging folder at once; those a crash left behind are removed when the next job starts. The
out_dir must be on a filesystem that every drafter rank and the driver share.

Reading: ``resume=auto`` (the default) takes the newest folder that checks out (state.json
readable and complete, every file of the recorded size and digest) and warns about each newer
one it skips; with none usable it warns once and the job starts fresh. ``resume=null`` on an
out_dir that holds step folders is refused: the fresh job would overwrite them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from pipeline.checkpoint.files import (READ_THREADS, FileRecord, fsync_dir, fsync_file,
                                       sha256_files)
from pipeline.checkpoint.point import ResumePoint
from pipeline.runtime.diskfull import writing
from pipeline.checks.preflight import PreflightError

log = logging.getLogger(__name__)

_PREFIX = "step_"
_STATE_KEYS = ("step", "epoch", "samples_done", "files")


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def staging_dir(out_dir: str | Path, step: int) -> Path:
    path = checkpoint_root(out_dir) / f".{_PREFIX}{step:08d}.tmp-{os.getpid()}"
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def clean_stale(out_dir: str | Path) -> list[Path]:
    """Remove staging and moved-aside folders that an interrupted job left behind."""
    stale = _unfinished(out_dir)
    for path in stale:
        log.warning("removing %s: left by an interrupted checkpoint write", path)
        shutil.rmtree(path, ignore_errors=True)
    return stale


def discard_unfinished(out_dir: str | Path) -> list[Path]:
    """Remove this job's unfinished writes (staging folders, and moved-aside ones of a publish
    cut short) when it stops early (Ctrl-C, SIGTERM): call it only once nothing of the job
    writes any more. A checkpoint already renamed into place stays."""
    gone = _unfinished(out_dir)
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    if gone:
        log.info("removed %s: unfinished when the job stopped", ", ".join(p.name for p in gone))
    return gone


def _unfinished(out_dir: str | Path) -> list[Path]:
    root = checkpoint_root(out_dir)
    return sorted(p for p in root.iterdir() if p.name.startswith(f".{_PREFIX}")) \
        if root.is_dir() else []


def finalize(staging: Path, point: ResumePoint, files: list[FileRecord], extra: dict[str, Any],
             keep_last: int = 0) -> Path:
    """Write state.json, make the staged folder durable and rename it into place. If that
    fails (a full disk: DiskFullError naming the file), the staging folder is removed."""
    try:
        _make_durable(staging, {**asdict(point), "files": [asdict(f) for f in files], **extra})
    except BaseException:
        discard(staging)
        raise
    root = staging.parent
    final = root / f"{_PREFIX}{point.step:08d}"
    aside = root / f".{final.name}.old-{os.getpid()}"
    moved = False
    # Both renames in one try: a Ctrl-C or SIGTERM lands between any two bytecodes, and one
    # right after the first rename must still put the old folder back.
    try:
        if final.exists():  # a rerun of the same step: keep the old one until the new one is in
            os.rename(final, aside)
            moved = True
        os.rename(staging, final)
    except BaseException:
        if aside.exists() and not final.exists():
            os.rename(aside, final)
        discard(staging)
        raise
    fsync_dir(root)
    if moved:
        shutil.rmtree(aside)
    prune(root, keep_last)
    return final


def _make_durable(staging: Path, state: dict[str, Any]) -> None:
    with writing(staging / "state.json"):
        (staging / "state.json").write_text(json.dumps(state, indent=2))
    for path in sorted(staging.rglob("*"), reverse=True):  # files, then their folders
        if path.is_file():
            with writing(path):
                fsync_file(path)
        else:
            fsync_dir(path)
    fsync_dir(staging)


def discard(staging: Path) -> None:
    """Remove a staging folder whose checkpoint failed: nothing half-written stays behind."""
    shutil.rmtree(staging, ignore_errors=True)


def prune(root: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` step folders (0 keeps all)."""
    if keep_last <= 0:
        return []
    old = _step_folders(root)[:-keep_last]
    for path in old:
        # Renamed first: a crash mid-delete leaves a hidden folder, never a torn step_N.
        doomed = root / f".{path.name}.old-{os.getpid()}"
        os.rename(path, doomed)
        shutil.rmtree(doomed)
    return old


def problem(path: Path) -> Optional[str]:
    """Why ``path`` is not a usable checkpoint, or None when it checks out."""
    try:
        state = json.loads((path / "state.json").read_text())
    except (OSError, ValueError) as exc:
        return f"state.json unreadable ({exc})"
    missing = [k for k in _STATE_KEYS if k not in state]
    if missing:
        return f"state.json lacks {missing}"
    for f in state["files"]:
        file = path / f["name"]
        if not file.is_file():
            return f"{f['name']} is missing"
        if file.stat().st_size != f["size"]:
            return f"{f['name']} has {file.stat().st_size} bytes, {f['size']} were written"
    digests = sha256_files([path / f["name"] for f in state["files"]], READ_THREADS)
    for f, digest in zip(state["files"], digests):
        if digest != f["sha256"]:
            return f"{f['name']} does not match its recorded sha256"
    return None


def latest(out_dir: str | Path) -> Optional[Path]:
    """The newest usable checkpoint under out_dir; each newer unusable one is skipped, warned.
    When none is usable, one warning says so (not one per folder)."""
    path, skipped = _newest_usable(out_dir)
    if path is None and skipped:
        log.warning("%s", _none_usable(out_dir, skipped))
    return path


def _newest_usable(out_dir: str | Path) -> tuple[Optional[Path], list[tuple[Path, str]]]:
    skipped: list[tuple[Path, str]] = []
    for path in reversed(step_folders(out_dir)):
        why = problem(path)
        if why is None:
            for folder, reason in skipped:
                log.warning("skipping checkpoint %s: %s; took the previous one", folder, reason)
            return path, skipped
        skipped.append((path, why))
    return None, skipped


def _none_usable(out_dir: str | Path, skipped: list[tuple[Path, str]]) -> str:
    newest, why = skipped[0]
    return (f"none of the {len(skipped)} checkpoint(s) under {checkpoint_root(out_dir)} is "
            f"usable (the newest, {newest.name}: {why})")


def resolve_resume(resume: Optional[str], out_dir: str | Path) -> Optional[Path]:
    """train.checkpoint.resume: "auto" (latest usable, else fresh), a path, or null (fresh,
    refused where out_dir already holds checkpoints: the new ones would overwrite them)."""
    if resume is None:
        found = step_folders(out_dir)
        if found:
            raise PreflightError(
                f"train.checkpoint.resume=null, but train.out_dir={str(out_dir)!r} holds "
                f"{len(found)} checkpoint(s) (newest {found[-1].name}) that a fresh start would "
                f"overwrite: resume them (train.checkpoint.resume=auto, the default), pick "
                f"another train.out_dir, or delete {checkpoint_root(out_dir)}")
        return None
    if resume == "auto":
        path, skipped = _newest_usable(out_dir)
        if path is None and skipped:
            log.warning("%s: starting from step 0", _none_usable(out_dir, skipped))
        return path
    path = Path(resume)
    why = problem(path) if path.is_dir() else "not a folder"
    if why is not None:
        raise PreflightError(f"train.checkpoint.resume={resume!r} is not a usable checkpoint "
                             f"folder: {why}; allowed: auto, a step_* folder, or null")
    return path


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((path / "state.json").read_text())


def read_point(path: Path) -> ResumePoint:
    state = read_state(path)
    return ResumePoint(step=state["step"], epoch=state["epoch"],
                       samples_done=state["samples_done"])


def step_folders(out_dir: str | Path) -> list[Path]:
    """The step_* folders under out_dir, oldest first (usable or not)."""
    return _step_folders(checkpoint_root(out_dir))


def _step_folders(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))
