"""Trainer state on disk: durable writes, and loads that run no code.

``torch.load(weights_only=False)`` unpickles whatever a file holds, so a checkpoint from
elsewhere could execute code on load. Every load here uses torch's restricted unpickler
(tensors, plain containers and numbers only) and turns a refusal into a ValueError naming
the file. Writes are fsynced, so a file that a rename later makes visible is on disk; a full
disk is raised as a DiskFullError naming the file.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from pipeline.runtime.diskfull import writing


@dataclass(frozen=True)
class FileRecord:
    """What a checkpoint records about a file it holds, to tell a complete one from a torn one."""

    name: str
    size: int
    sha256: str


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (new names, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# Files of a checkpoint read at once, by a check (a resume, an export) and by a load: a save
# writes train.checkpoint.write_threads files per rank, and any number loads.
READ_THREADS = 4


def sha256_files(paths: Sequence[Path], threads: int) -> list[str]:
    """:func:`sha256_file` of each path, up to ``threads`` files at once: file reads and
    hashlib release the GIL, so a checkpoint of several files reads back at several times one
    thread's rate (a 12.6 GB checkpoint at 8B takes seconds per thread)."""
    threads = min(threads, len(paths))
    if threads <= 1:
        return [sha256_file(p) for p in paths]
    with ThreadPoolExecutor(threads, thread_name_prefix="sha256") as pool:
        return list(pool.map(sha256_file, paths))


class _HashingFile:
    """A write-only file that hashes what passes through (hashlib releases the GIL), and
    keeps the first OSError a write raised: torch.save replaces it with a RuntimeError."""

    def __init__(self, f) -> None:
        self.f = f
        self.digest = hashlib.sha256()
        self.error: OSError | None = None

    def write(self, data) -> int:
        self.digest.update(data)
        try:
            return self.f.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        self.f.flush()


def save_state(state: dict[str, Any], path: Path) -> FileRecord:
    """torch.save, fsync, and read back: the record a checkpoint keeps to verify it later
    holds the digest of the bytes torch.save produced, and the bytes on disk match it.
    A full disk raises DiskFullError naming ``path`` (a partial file stays: its folder's
    owner removes it)."""
    out = None
    with writing(path):
        try:
            with open(path, "wb") as raw:
                out = _HashingFile(raw)
                torch.save(state, out)
                raw.flush()
                os.fsync(raw.fileno())
        except RuntimeError as exc:
            # torch.save reports a failed write as "inline_container.cc ... unexpected pos";
            # the OSError the file raised says why.
            if out is None or out.error is None:
                raise
            raise out.error from exc
    digest = out.digest.hexdigest()
    on_disk = sha256_file(path)
    if on_disk != digest:
        raise OSError(f"{path}: read back as sha256 {on_disk}, written as {digest}")
    return FileRecord(path.name, path.stat().st_size, digest)


def load_state(path: Path) -> dict[str, Any]:
    """The state in ``path`` on the host, unpickled without running code; ValueError if it
    holds more, or if it is unreadable.

    Always to the CPU, memory-mapped: RNG states must stay CPU ByteTensors for
    ``torch.set_rng_state``, ``load_state_dict`` moves weights and AdamW moments to the
    parameters' device itself, and several drafters of a node reading a 12.6 GB file at once
    share the page cache instead of holding a private copy each. Running out of memory is not
    a corrupt file: it is raised as such (MemoryError), never as a ValueError.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{path}: refused to load: it holds objects beyond tensors and plain "
                         f"containers, and loading it could run code ({exc})") from None
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, EOFError) as exc:  # a truncated or otherwise unreadable zip
        if out_of_memory(exc):
            raise MemoryError(f"{path}: out of memory while loading ({exc})") from exc
        raise ValueError(f"{path}: not a readable checkpoint file ({exc})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a dict of trainer state, got {type(state).__name__}")
    return state


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure (GPU or host), not a problem of the data."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc)
    return "out of memory" in text or "can't allocate memory" in text
