"""A checkpoint read into host memory while the drafter that will load it starts up.

A drafter restarted after a loss, or started to resume, spends seconds before it can load:
its CUDA context, the target's head, the drafter's build. Its load then read the files,
deserialised them and copied them to the GPU (at the Qwen3-8B shape 12.6 GB: 10.6 s of a
32 s restart on the H200). Told the folder when it is built, the drafter reads it here in a
thread of its own meanwhile, into host tensors (pageable: pinning them stalled the build
beside the read, see DrafterWorker._read_ahead; pinned ones, where a caller asks, become the
buffers for its next saves); the load then copies the weights into place and hands the
optimizer its state (moved to the GPU; on the host, these tensors).

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
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from pipeline.checkpoint.sharded import (DRAFTER_DIR, LEGACY_FILE, SafePlanner, SafeReader,
                                         param_names, plain_errors, quiet_single_process)

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

    def spare(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        """After :meth:`load_into`, the host tensors nothing holds: all on a GPU (copied to
        the device), the weights' on the host (the optimizer keeps its state's tensors)."""
        kept = {t.data_ptr() for s in optimizer.state.values() for t in s.values()
                if isinstance(t, torch.Tensor)}
        return [t for t in self.tensors() if t.data_ptr() not in kept]

    def load_into(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """What a load of the folder does, from host memory: the weights copied into the
        parameters; the optimizer given its state by ``optimizer.load_state_dict``, which moves
        these tensors to the parameters' device (on the host it keeps them: nothing copied).
        A weight the checkpoint lacks or holds in another shape, or other parameter groups,
        raise. A fresh optimizer needs no step of its own first (a load from the files does:
        DCP reads into tensors that exist)."""
        on_cuda = self._copy_weights(get_model_state_dict(model))
        saved = self._nested("optimizer")
        live = param_names(model, optimizer)
        groups = [saved["param_groups"][i] for i in sorted(saved.get("param_groups", {}))]
        if [g.get("params") for g in groups] != live:
            raise RuntimeError(f"{self.folder}: the checkpoint's optimizer has other parameter "
                               f"groups than the drafter's")
        index = {n: i for i, n in enumerate(n for names in live for n in names)}
        optimizer.load_state_dict({
            "state": {index[n]: dict(s) for n, s in saved.get("state", {}).items()
                      if n in index},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]}
                             for g in groups]})
        if on_cuda:
            torch.cuda.synchronize()  # the host tensors may be reused (as save buffers)

    def _copy_weights(self, weights: dict[str, torch.Tensor]) -> bool:
        """Copy the checkpoint's weights into ``weights`` (the model's state dict, sharing the
        parameters' storage); whether any went to a GPU."""
        filled, on_cuda = set(), False
        for key, value in self.values.items():
            place = self.places[key]
            if place[0] != "model" or len(place) != 2 or place[1] not in weights:
                continue
            live = weights[place[1]]
            if tuple(live.shape) != tuple(value.shape):
                raise RuntimeError(f"{self.folder}: {key} is {tuple(value.shape)} in the "
                                   f"checkpoint, {tuple(live.shape)} in the drafter")
            with torch.no_grad():
                live.copy_(value, non_blocking=self.pinned)
            filled.add(place[1])
            on_cuda |= live.is_cuda
        lacking = [name for name in weights if name not in filled]
        if lacking:
            raise RuntimeError(f"{self.folder}: the checkpoint lacks {len(lacking)} of the "
                               f"drafter's weights, e.g. model.{lacking[0]}")
        return on_cuda

    def _nested(self, top: str) -> dict[Any, Any]:
        """The values under ``top`` as nested dicts (list positions as int keys)."""
        out: dict[Any, Any] = {}
        for key, value in self.values.items():
            place = self.places[key]
            if place[0] != top:
                continue
            node = out
            for part in place[1:-1]:
                node = node.setdefault(part, {})
            node[place[-1]] = value
        return out


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
    quiet_single_process()
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
        quiet_single_process()  # here: the thread's own call then changes no filter
        self._thread = threading.Thread(target=self._run, args=(pin,),
                                        name="checkpoint-read-ahead", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, folder: Path, pin: bool) -> Optional["ReadAhead"]:
        """None where there is nothing to read ahead: a checkpoint of the format before DCP
        (one file, read at the load), or too little free host memory to hold it twice over
        (said in one line)."""
        if (folder / LEGACY_FILE).is_file() or not (folder / DRAFTER_DIR).is_dir():
            log.info("not reading %s ahead: not a DCP checkpoint (one written before DCP is "
                     "read whole at the load)", folder)
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
