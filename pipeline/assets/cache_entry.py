"""A cached folder (the demo's assets, a GGUF conversion) that proves it is still whole.

A folder is built in a temporary sibling and renamed into place, so it is never seen half
built; but it can be damaged after that (a disk error, a stray edit, a copy cut short), and a
damaged folder used to fail every later run the same way, deep inside an actor. Each entry
therefore carries :data:`LISTING`, the size and sha256 of each of its files, written before
the rename. On each use the sizes are compared and the model files' headers checked
(pipeline/assets/integrity.py): milliseconds whatever the model's size. An entry of at most
:data:`FULL_CHECK_BYTES` (the demo's is 2.4 MB) is hashed too, which costs as little; a larger
one (a converted 8B model is 32 GB) is hashed only after a load from it failed
(:func:`recheck_after_failure`). A damaged entry is moved aside and removed; its owner builds
it again under its lock.

Building folders left by a killed builder are swept on the next use (:func:`sweep_leftovers`):
a builder holds the entry's lock for as long as it builds, so a leftover is one whose lock is
free.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from pipeline.assets.integrity import BrokenModelFile, check_model_file

log = logging.getLogger(__name__)

LISTING = "cached_files.json"
# Entries up to this size are hashed on every use: 64 MiB is about 40 ms of sha256.
FULL_CHECK_BYTES = 64 << 20
# The temporary siblings of an entry ``name``: ``.name.<kind>-<random>``.
LEFTOVER_KINDS = ("building", "converting", "damaged")
_MODEL_SUFFIXES = (".safetensors", ".gguf")


@contextmanager
def file_lock(path: str) -> Iterator[None]:
    """The lock a builder of an entry holds while it builds (``<entry>.lock``)."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def file_sha256(path) -> str:
    """The file's sha256, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and p.name != LISTING)


def write_listing(folder: str) -> None:
    """Record the size and sha256 of every file of ``folder`` (before it is renamed into place,
    or when an entry cached before listings existed is adopted)."""
    root = Path(folder)
    files = {name: {"size": (root / name).stat().st_size, "sha256": file_sha256(root / name)}
             for name in _files(root)}
    # Written then renamed: two processes adopting one entry at once each write it whole.
    fd, tmp = tempfile.mkstemp(prefix=f".{LISTING}.", dir=folder)
    with os.fdopen(fd, "w") as f:
        json.dump({"files": files}, f, indent=1, sort_keys=True)
    os.replace(tmp, root / LISTING)


def _listing(folder: Path) -> Optional[dict]:
    try:
        return json.loads((folder / LISTING).read_text())["files"]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, OSError):
        return {}  # a damaged listing lists nothing true: the entry is rebuilt


def problem(folder: str) -> Optional[str]:
    """Why the entry ``folder`` is damaged (one line naming a file), or None where it is whole
    as far as the checks on each use see. An entry cached before listings existed has only
    its model files' headers checked."""
    root = Path(folder)
    files = _listing(root)
    if files == {}:
        return f"{root / LISTING}: unreadable"
    for name, want in (files or {}).items():
        path = root / name
        if not path.is_file():
            return f"{path}: missing"
        size = path.stat().st_size
        if size != want["size"]:
            return f"{path}: {size:,} bytes where {want['size']:,} were cached"
    names = list(files) if files is not None else _files(root)
    for name in names:
        if name.endswith(_MODEL_SUFFIXES):
            try:
                check_model_file(str(root / name))
            except BrokenModelFile as e:
                return str(e)
    if files and sum(w["size"] for w in files.values()) <= FULL_CHECK_BYTES:
        return _hash_problem(root, files)
    return None


def _hash_problem(root: Path, files: dict) -> Optional[str]:
    for name, want in files.items():
        if file_sha256(root / name) != want["sha256"]:
            return f"{root / name}: its sha256 differs from when it was cached"
    return None


def adopt(folder: str) -> None:
    """Give an entry cached before listings existed its listing, taken as it is now (its model
    files passed :func:`problem`'s header checks; nothing older to compare with)."""
    if not (Path(folder) / LISTING).exists():
        write_listing(folder)
        log.info("%s: recorded the sizes and sha256 of its files (cached before they were), "
                 "checked on each use from now on", folder)


def discard(folder: str) -> None:
    """Move a damaged entry aside, then remove it: its name is free at once for a rebuild,
    and a removal cut short leaves a sibling that :func:`sweep_leftovers` removes later.
    The caller holds the entry's lock (a sweep would take the sibling from under it)."""
    parent, name = os.path.split(os.path.abspath(folder))
    aside = tempfile.mkdtemp(prefix=f".{name}.damaged-", dir=parent)
    os.rename(folder, os.path.join(aside, name))
    shutil.rmtree(aside, ignore_errors=True)


def recheck_after_failure(path: str) -> Optional[str]:
    """After a load from ``path`` (an entry, or a folder inside one) failed: hash every file
    of the entry against its listing. A damaged entry is discarded and the line saying so
    returned (the caller builds it again and retries); None where the entry is whole, or
    ``path`` is no cached entry (the failure is not the cache's)."""
    for folder in (Path(path), Path(path).parent):
        files = _listing(folder)
        if files:
            with file_lock(f"{folder}.lock"):
                damage = _hash_problem(folder, files) if (folder / LISTING).exists() else None
                if damage is None:  # whole, or discarded by another process meanwhile
                    return None
                discard(str(folder))
            line = f"{damage}: the cached copy was damaged after it was made, and is made again"
            log.warning("%s", line)
            return line
    return None


def sweep_leftovers(entry: str, lock_path: str) -> None:
    """Remove the temporary siblings of ``entry`` that a killed builder left behind. Builders
    hold ``lock_path`` while they build: where it is taken now, they are left alone."""
    parent, name = os.path.split(os.path.abspath(entry))
    prefixes = tuple(f".{name}.{kind}-" for kind in LEFTOVER_KINDS)
    try:
        stale = sorted(n for n in os.listdir(parent) if n.startswith(prefixes))
    except FileNotFoundError:
        return
    if not stale:
        return
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a live builder: its folder is in use
        try:
            for leftover in stale:
                shutil.rmtree(os.path.join(parent, leftover), ignore_errors=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    log.info("removed %d folder(s) left in %s by an interrupted build: %s", len(stale), parent,
             ", ".join(stale))
