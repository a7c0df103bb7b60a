"""Trainer state on disk: durable writes, and loads that run no code.

``torch.load(weights_only=False)`` unpickles whatever a file holds, so a checkpoint from
elsewhere could execute code on load. Every load here uses torch's restricted unpickler
(tensors, plain containers and numbers only) and turns a refusal into a ValueError naming
the file. Writes are fsynced, so a file that a rename later makes visible is on disk.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


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


def record_of(path: Path) -> FileRecord:
    return FileRecord(path.name, path.stat().st_size, sha256_file(path))


def save_state(state: dict[str, Any], path: Path) -> FileRecord:
    """torch.save, then fsync; returns the record a checkpoint keeps to verify it later."""
    torch.save(state, path)
    fsync_file(path)
    return record_of(path)


def load_state(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    """The state in ``path``, unpickled without running code; ValueError if it holds more."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{path}: refused to load: it holds objects beyond tensors and plain "
                         f"containers, and loading it could run code ({exc})") from None
    except (RuntimeError, EOFError) as exc:  # a truncated or otherwise unreadable zip
        raise ValueError(f"{path}: not a readable checkpoint file ({exc})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a dict of trainer state, got {type(state).__name__}")
    return state
