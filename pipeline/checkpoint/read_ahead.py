"""A checkpoint read into host memory while the drafter that will load it starts up.

A drafter restarted after a loss, or started to resume, spends seconds before it can load:
its CUDA context, the target's head, the drafter's build. Its load then read the files,
deserialised them and copied them to the GPU (at the Qwen3-8B shape 12.6 GB: 10.6 s of a
32 s restart on the H200). Told the folder when it is built, the drafter reads it here in a
thread of its own meanwhile, into host tensors (pinned on CUDA when the rank writes
checkpoints: they become its buffers for the next saves); the load then only copies them into
place.

Whole tensors only: an fsdp rank needs only its shards, which are known once the group is
formed, so it reads at the load as before (pipeline/checkpoint/sharded.py). A read that fails
here is dropped: the load reads the files itself and raises its own error.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from pipeline.checkpoint.sharded import (DRAFTER_DIR, LEGACY_FILE, SafePlanner, SafeReader,
                                         plain_errors)

log = logging.getLogger(__name__)

Place = tuple[Any, ...]  # a value's place in the nested state: keys and list positions


@dataclass
class HostCheckpoint:
    """A checkpoint's ``drafter/`` folder in host memory, by DCP key."""

    folder: Path
    values: dict[str, Any]     # a host tensor, or a saved setting (lr, betas, names)
    places: dict[str, Place]   # where each key sits in the nested state (the save's index)
    pinned: bool

    def tensors(self) -> list[torch.Tensor]:
        return [v for v in self.values.values() if isinstance(v, torch.Tensor)]

    def fill(self, state: dict[str, Any]) -> None:
        """Copy into ``state`` (pipeline.checkpoint.sharded.drafter_state: whole tensors) what
        a DCP load of this folder would: every tensor of ``state`` from the key at its place,
        the settings replaced; keys ``state`` lacks are ignored. A tensor the checkpoint
        lacks, or of another shape, raises."""
        filled: set[Place] = set()
        on_cuda = False
        for key, value in self.values.items():
            place = self.places[key]
            holder = _holder(state, place)
            if holder is None:
                continue
            if isinstance(value, torch.Tensor):
                live = holder[place[-1]]
                if tuple(live.shape) != tuple(value.shape):
                    raise RuntimeError(f"{self.folder}: {key} is {tuple(value.shape)} in the "
                                       f"checkpoint, {tuple(live.shape)} in the drafter")
                live.copy_(value, non_blocking=self.pinned)
                on_cuda |= live.is_cuda
                filled.add(place)
            else:
                holder[place[-1]] = value
        lacking = [".".join(map(str, p)) for p in _tensor_places(state) if p not in filled]
        if lacking:
            raise RuntimeError(f"{self.folder}: the checkpoint lacks {len(lacking)} of the "
                               f"drafter's tensors, e.g. {lacking[0]}")
        if on_cuda:
            torch.cuda.synchronize()  # the host tensors may be reused (as save buffers)


def _holder(state: Any, place: Place) -> Optional[Any]:
    """The dict or list holding ``place``'s last part, or None where ``state`` has no such
    place."""
    node = state
    for part in place[:-1]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return None
    if isinstance(node, dict) and place[-1] in node:
        return node
    if isinstance(node, list) and isinstance(place[-1], int) and place[-1] < len(node):
        return node
    return None


def _tensor_places(node: Any, prefix: Place = ()) -> list[Place]:
    if isinstance(node, torch.Tensor):
        return [prefix]
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _tensor_places(v, (*prefix, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _tensor_places(v, (*prefix, i))]
    return []


def read(folder: Path, pin: bool) -> HostCheckpoint:
    """Every tensor and setting of ``folder/drafter`` into host memory, whole (chunks saved by
    several ranks put together), through the same reader and planner as a load."""
    reader = SafeReader(folder / DRAFTER_DIR)
    metadata = reader.read_metadata()
    if not metadata.planner_data:
        raise ValueError(f"{folder}: the checkpoint's index has no places for its keys")
    values: dict[str, Any] = {
        key: torch.empty(md.size, dtype=md.properties.dtype, pin_memory=pin)
        if isinstance(md, TensorStorageMetadata) else None
        for key, md in metadata.state_dict_metadata.items()}
    with plain_errors():
        dcp.load(values, storage_reader=reader,
                 planner=SafePlanner(folder, flatten_state_dict=False,
                                     flatten_sharded_tensors=False), no_dist=True)
    places = {key: tuple(metadata.planner_data[key]) for key in values}
    return HostCheckpoint(folder, values, places, pin)


def checkpoint_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in (folder / DRAFTER_DIR).iterdir() if f.is_file())


def available_memory_bytes() -> Optional[int]:
    """The host's MemAvailable (Linux), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class ReadAhead:
    """:func:`read` of one folder in a background thread, begun by :meth:`start`."""

    def __init__(self, folder: Path, pin: bool) -> None:
        self.folder = folder
        self._result: Optional[HostCheckpoint] = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(pin,),
                                        name="checkpoint-read-ahead", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, folder: Path, pin: bool) -> Optional["ReadAhead"]:
        """None where there is nothing to read ahead: a checkpoint of the format before DCP
        (one file, read at the load), or too little free host memory to hold it twice over
        (said in one line)."""
        if (folder / LEGACY_FILE).is_file() or not (folder / DRAFTER_DIR).is_dir():
            return None
        size, free = checkpoint_bytes(folder), available_memory_bytes()
        if free is not None and free < 2 * size:
            log.info("not reading %s ahead: %.1f GB free on the host, %.1f GB needed twice "
                     "over; the load reads it", folder, free / 1e9, size / 1e9)
            return None
        return cls(folder, pin)

    def _run(self, pin: bool) -> None:
        try:
            self._result = read(self.folder, pin)
        except BaseException as exc:  # the load reads the files again and raises its own
            self._error = exc

    def take(self, folder: Path) -> Optional[HostCheckpoint]:
        """The folder in host memory, once read; None when ``folder`` is another one or the
        read failed (the caller then reads the files)."""
        self._thread.join()
        if Path(folder) != self.folder:
            return None
        if self._error is not None:
            log.info("reading %s ahead failed (%s); the load reads it", folder, self._error)
            return None
        return self._result
