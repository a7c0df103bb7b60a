"""The drafter's weights and AdamW state on disk through torch.distributed.checkpoint (DCP).

A checkpoint folder holds them in ``drafter/`` (DCP's format: one ``__<rank>_0.distcp`` file
per writing rank and a ``.metadata`` index of every tensor's chunks). Every rank enters a save
and a load, at a step boundary or before training, and each handles its own part:

- under drafter.parallel=fsdp each rank writes its own shards: nothing is gathered;
- under replicate the replicas are identical, and the planner gives every tensor to the lowest
  rank holding it: rank 0 writes everything, the others take part in the planning only.

A load reads whatever chunks the ranks of *this* job need, so a checkpoint saved by 2 fsdp
ranks loads at 1 or 3 ranks, or into replicas, and a replicated one into shards (resharding).
DCP's collectives run on a gloo group of their own (writer.checkpoint_group): a background
save plans and finishes on it while the step loop's group (NCCL on GPUs) goes on training.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import pathlib
import pickle
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Optional, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import (FileSystem, FileSystemReader,
                                                    FileSystemWriter, _StorageInfo)
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict,
                                                     set_state_dict)

from pipeline.checkpoint.files import READ_THREADS, out_of_memory
from pipeline.dist import fsdp

DRAFTER_DIR = "drafter"
# The one file of a checkpoint written before DCP: the whole trainer state (torch.save).
LEGACY_FILE = "drafter.pt"


@contextlib.contextmanager
def shards_in_place(model: nn.Module, sharded: bool) -> Iterator[None]:
    """Under fsdp the module's parameters are the gathered weights between steps; its state
    dict is read and written on the shards. Gathering again is a collective (every rank, at a
    step boundary: a save or a load is entered by every rank there)."""
    if sharded:
        fsdp.scatter(model)
    try:
        yield
    finally:
        if sharded:
            fsdp.gather(model)


def drafter_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The weights and AdamW state keyed by parameter name (shards as DTensors under fsdp):
    the same keys in every mode and at every world size, which is what lets a load reshard.

    An optimizer that has not updated yet (every step so far skipped) has no state, and is
    saved so: get_state_dict would give it state by a step of its own, which changes the
    bias correction of every later update."""
    if optimizer.state:
        weights, optim = get_state_dict(model, optimizer)
        return {"model": weights, "optimizer": optim}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": names}
              for g, names in zip(optimizer.param_groups, param_names(model, optimizer))]
    return {"model": get_model_state_dict(model),
            "optimizer": {"state": {}, "param_groups": groups}}


def param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """Each parameter group's parameters by name, as a checkpoint keys them."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]


def save(state: dict[str, Any], folder: Path, group: Optional[dist.ProcessGroup],
         threads: int = 1) -> None:
    """Write ``state`` (host copies) into ``folder/drafter``, fsynced, in ``threads`` files
    per rank written at once. Every rank of ``group`` calls this; it returns once every rank's
    files and the index are written (DCP's closing exchange), and raises on every rank if any
    rank's write failed."""
    if group is None:
        quiet_single_process()
    with plain_errors():
        dcp.save(state, storage_writer=_Writer(folder / DRAFTER_DIR, threads),
                 planner=DefaultSavePlanner(dedup_save_to_lowest_rank=True),
                 process_group=group, no_dist=group is None)


class _Writer(FileSystemWriter):
    """DCP's file writer (fsynced; ``threads`` files per rank, each written by a thread of its
    own: serialising is CPU-bound, about 0.4-0.9 GB/s a thread), but a write that fails raises
    the OSError its file raised, naming the file: torch.save, which DCP serialises tensors
    with, reports a failed write only as "inline_container.cc ... unexpected pos" (a full disk
    must say so, with its errno). DCP's extra threads drop what they fail on (the thread dies,
    its files' results are missing), so a save whose results do not cover its plan raises."""

    def __init__(self, path: Path, threads: int) -> None:
        super().__init__(path, sync_files=True, thread_count=threads)
        self.fs = _RecordingFileSystem()

    def write_data(self, plan: Any, planner: Any) -> Any:
        done = super().write_data(plan, planner)
        if self.fs.failed is not None:
            raise self.fs.failed
        written = len(done.value())
        if written != len(plan.items):
            raise RuntimeError(f"{self.path}: {len(plan.items) - written} of {len(plan.items)} "
                               f"checkpoint items were not written (a writer thread failed)")
        return done


class _RecordingFileSystem(FileSystem):
    """Keeps the first error a file's write raised, an OSError with the file's name (also one
    its closing raised), and ends that file's writing there: the thread goes on to its next
    file, and :class:`_Writer` raises the kept error once every thread is done. (Raised in one
    of DCP's extra threads, it would end that thread with a traceback on stderr.)"""

    def __init__(self) -> None:
        super().__init__()
        self.failed: Optional[Exception] = None
        self._lock = threading.Lock()

    def record(self, exc: Exception) -> None:
        with self._lock:
            if self.failed is None:
                self.failed = exc

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        try:
            with super().create_stream(path, mode) as stream:
                yield _RecordingStream(stream, self, str(path))
        except OSError as exc:  # also the buffered rest failing when the file closes
            self.record(exc if exc.filename is not None
                        else OSError(exc.errno, exc.strerror, str(path)))
        except Exception as exc:  # torch.save's RuntimeError after a failed write (recorded)
            self.record(exc)


class _RecordingStream:
    """A file whose failed writes are recorded on the file system (everything else is the
    file's own)."""

    def __init__(self, stream: Any, fs: _RecordingFileSystem, name: str) -> None:
        self._stream, self._fs, self._name = stream, fs, name

    def write(self, data: Any) -> int:
        try:
            return self._stream.write(data)
        except OSError as exc:
            self._fs.record(OSError(exc.errno, exc.strerror, self._name))
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class HostState(Protocol):
    """A checkpoint already read into host memory (read_ahead.HostCheckpoint). Named here as
    a protocol so that this module, which read_ahead builds on, never imports it back."""

    def load_into(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None: ...


def load(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path,
         group: Optional[dist.ProcessGroup], host: Optional[HostState] = None) -> None:
    """Load ``folder/drafter`` into the model and optimizer as this job shards them (the
    model's parameters must be the shards: see :func:`shards_in_place`). ``host``: the same
    checkpoint already read into host memory (pipeline/checkpoint/read_ahead.py: whole
    tensors, for a drafter that is not sharded), copied from there instead of read."""
    if host is not None:
        host.load_into(model, optimizer)
        return
    reader = SafeReader(folder / DRAFTER_DIR)
    if any(k.startswith("optimizer.state.") for k in reader.read_metadata().state_dict_metadata):
        init_optimizer_state(optimizer)  # DCP loads into the tensors a state dict names
    state = drafter_state(model, optimizer)
    if group is None:
        quiet_single_process()
    with plain_errors():
        dcp.load(state, storage_reader=reader, planner=SafePlanner(folder),
                 process_group=group, no_dist=group is None)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])


def load_weights(model: nn.Module, folder: Path) -> None:
    """Only the weights of ``folder/drafter``, into a whole model in this process (no
    group): an export."""
    state = {"model": model.state_dict()}
    quiet_single_process()
    with plain_errors():
        dcp.load(state, storage_reader=SafeReader(folder / DRAFTER_DIR),
                 planner=SafePlanner(folder), no_dist=True)
    model.load_state_dict(state["model"])


_SINGLE_PROCESS = "torch.distributed is disabled, unavailable or uninitialized"


def quiet_single_process() -> None:
    """DCP warns on every call made without a process group ("torch.distributed is disabled
    ... assuming the intent is to load in a single process"), also when ``no_dist=True`` says
    so: an export, a read-ahead's thread and a single-process trainer mean it, and their users
    can do nothing about the line. A filter, not a catch_warnings block (not thread-safe; a
    read-ahead runs in a thread), left alone when it is already the first one (then nothing
    changes the filter list another thread may be reading)."""
    first = warnings.filters[0] if warnings.filters else None
    if first is not None and first[0] == "ignore" and first[2] is UserWarning and \
            getattr(first[1], "pattern", None) == _SINGLE_PROCESS:
        return
    warnings.filterwarnings("ignore", message=_SINGLE_PROCESS, category=UserWarning)


@contextlib.contextmanager
def plain_errors() -> Iterator[None]:
    """DCP raises a CheckpointException, a BaseException holding each failed rank's error:
    raise the lowest failed rank's own error instead (a full disk keeps its errno; callers
    that catch Exception see it)."""
    try:
        yield
    except CheckpointException as exc:
        for rank in sorted(exc.failures):
            inner = exc.failures[rank][0]
            if isinstance(inner, Exception):
                raise inner from None
        raise RuntimeError(f"torch.distributed.checkpoint failed: {exc}") from None


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its state tensors (AdamW makes them at its first step) by one
    step at lr 0 on zero gradients, which leaves the weights as they are; the load overwrites
    the state. The gradients and learning rates are put back as they were (the replicated
    trainer keeps gradient buffers of its own for the whole run)."""
    if optimizer.state:
        return
    params = [p for g in optimizer.param_groups for p in g["params"]]
    grads = [p.grad for p in params]
    lrs = [g["lr"] for g in optimizer.param_groups]
    for p in params:
        p.grad = torch.zeros_like(p)
    for g in optimizer.param_groups:
        g["lr"] = 0.0
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, lrs):
        g["lr"] = lr
    for p, grad in zip(params, grads):
        p.grad = grad


# What a DCP index holds: its own dataclasses and enum, the file index, torch's sizes, dtypes
# and layouts (a layout is pickled as a call of torch.serialization._get_layout on its name),
# the save's checkpoint id (a path).
_INDEX_TYPES: dict[tuple[str, str], Any] = {
    (c.__module__, c.__name__): c for c in (
        dcp_metadata.Metadata, dcp_metadata.TensorStorageMetadata,
        dcp_metadata.BytesStorageMetadata, dcp_metadata.ChunkStorageMetadata,
        dcp_metadata.TensorProperties, dcp_metadata.MetadataIndex, dcp_metadata.StorageMeta,
        dcp_metadata._MEM_FORMAT_ENCODING, _StorageInfo, torch.Size, collections.OrderedDict,
        pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePosixPath,
        pathlib.PureWindowsPath)}
_INDEX_TYPES[("torch.serialization", "_get_layout")] = torch.serialization._get_layout


class _IndexUnpickler(pickle.Unpickler):
    """Unpickles a DCP index, refusing every class but the index's own: a checkpoint from
    elsewhere must not run code on load (DCP itself unpickles ``.metadata`` unrestricted)."""

    def find_class(self, module: str, name: str) -> Any:
        found = _INDEX_TYPES.get((module, name))
        if found is not None:
            return found
        if module == "torch" and isinstance(getattr(torch, name, None),
                                            (torch.dtype, torch.layout, torch.memory_format)):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a DCP index")


class SafePlanner(DefaultLoadPlanner):
    """DCP's load planner, but the values of a checkpoint that are not tensors (the
    optimizer's settings: lr, betas, its parameters' names) are unpickled by torch's
    restricted loader: DCP's own unpickles them unrestricted, so a crafted checkpoint ran code
    on load. A refused value is a ValueError naming the folder and the key."""

    def __init__(self, folder: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._folder = folder

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        key = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise ValueError(f"{self._folder}: refused to load {key}: it holds objects beyond "
                             f"tensors and plain containers, and loading it could run code "
                             f"({exc})") from None
        # DCP places the value (it unpickles again, but what it reads is ours now)
        safe = io.BytesIO()
        torch.save(obj, safe)
        safe.seek(0)
        super().load_bytes(read_item, safe)


class SafeReader(FileSystemReader):
    """DCP's file reader with the index read by :class:`_IndexUnpickler`; tensors it already
    reads with torch's weights-only loader. A refused or unreadable index is a ValueError.
    The files it reads are read :data:`READ_THREADS` at once (DCP reads them one after the
    other: at 8B a restart waited about 17 s for 12.6 GB)."""

    def read_data(self, plan: Any, planner: Any) -> torch.futures.Future:
        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path,
                                []).append(item)

        def read(name: str) -> None:
            # One file's items; the planner places each into its own tensor (distinct keys).
            try:
                FileSystemReader.read_data(
                    self, dataclasses.replace(plan, items=per_file[name]), planner).wait()
            except (EOFError, RuntimeError, pickle.UnpicklingError) as exc:
                if out_of_memory(exc):
                    raise
                raise ValueError(f"{Path(self.path) / name}: not a readable checkpoint file "
                                 f"({type(exc).__name__}: {exc})") from None

        if len(per_file) <= 1:
            for name in per_file:
                read(name)
        else:
            with ThreadPoolExecutor(min(READ_THREADS, len(per_file)),
                                    thread_name_prefix="checkpoint-read") as pool:
                list(pool.map(read, per_file))
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(None)
        return done

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        path = Path(self.path) / ".metadata"
        try:
            with open(path, "rb") as f:
                metadata = _IndexUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, TypeError) as exc:
            raise ValueError(f"{path}: not a readable DCP index, refused to load ({exc})") \
                from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
