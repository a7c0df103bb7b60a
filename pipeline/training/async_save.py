"""Checkpoint writes off the training loop: a host snapshot, then a background write.

A synchronous save of the Qwen3-8B drafter (12.6 GB of fp32 weights and AdamW moments) held
the step loop for ~39 s: torch.save, fsync and a re-hash all ran on the drafter's main thread
while the other ranks waited in the all-reduce. Here the main thread only copies the state
into a host arena (pinned on CUDA, so the copy runs at PCIe speed) and returns; a writer
thread serialises the snapshot, fsyncs it and reads it back against the digest it computed
while writing. The checkpoint counts only once that read-back matched (the driver renames it
into place then), so it is as durable and verified as before.

The writer thread touches no GPU and runs no model code: the actor's compute still runs on
its main thread, where CUDA-graph state lives. The host buffers are allocated in the
background at construction (pinning 12.6 GB takes seconds) and reused by every save; a save
waits for the previous write to finish before it reuses them.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from pipeline.diskfull import is_disk_full
from pipeline.training.state_io import FileRecord, save_state

log = logging.getLogger(__name__)

Spec = tuple[tuple[int, ...], torch.dtype]


@dataclass(frozen=True)
class SaveDone:
    """A background write that finished: its record, or why it failed."""

    path: str
    steps_done: int
    record: Optional[FileRecord]
    error: Optional[str]
    snapshot_s: float  # what the save cost the training loop (the host copy)
    write_s: float     # serialise + fsync + read-back, in the background
    errno: Optional[int] = None  # of the OSError the write failed with (ENOSPC: disk full)


class HostPool:
    """Host tensors that snapshots copy into, reused from one save to the next.

    One tensor per state tensor (torch.save writes each storage whole, so views into one big
    arena would write the arena). Those given as ``expected`` are allocated in a background
    thread at once; a shape the pool lacks is allocated when first needed.
    """

    def __init__(self, expected: list[Spec], pin: bool) -> None:
        self._pin = pin
        self._free: dict[Spec, list[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._allocate, args=(expected,),
                                        name="host-pool-alloc", daemon=True)
        self._thread.start()

    def _allocate(self, specs: list[Spec]) -> None:
        for shape, dtype in specs:
            self.release([self._new(shape, dtype)])

    def _new(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=self._pin)

    def acquire(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        self._thread.join()
        with self._lock:
            free = self._free.get((tuple(shape), dtype))
            if free:
                return free.pop()
        return self._new(tuple(shape), dtype)

    def release(self, tensors: list[torch.Tensor]) -> None:
        with self._lock:
            for t in tensors:
                self._free.setdefault((tuple(t.shape), t.dtype), []).append(t)


def snapshot(state: Any, pool: HostPool) -> tuple[Any, list[torch.Tensor]]:
    """``state`` with every tensor replaced by a host copy (containers rebuilt, so later
    changes to the live state never reach the snapshot), and the pool tensors it holds."""
    taken: list[torch.Tensor] = []
    on_cuda = False

    def host_copy(t: torch.Tensor) -> torch.Tensor:
        nonlocal on_cuda
        out = pool.acquire(tuple(t.shape), t.dtype)
        taken.append(out)
        on_cuda |= t.is_cuda
        out.copy_(t.detach(), non_blocking=t.is_cuda)
        return out

    out = map_tensors(state, host_copy)
    if on_cuda:
        torch.cuda.synchronize()
    return out, taken


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` rebuilt with ``fn`` applied to every tensor in it (dicts, lists, tuples)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    return obj


class AsyncSaver:
    """Saves run one at a time in a writer thread; :meth:`done` hands back finished ones."""

    def __init__(self, pool: HostPool) -> None:
        self.pool = pool
        self._thread: Optional[threading.Thread] = None
        self._finished: list[SaveDone] = []
        self._lock = threading.Lock()

    def start(self, state_fn: Callable[[], Any], path: Path, steps_done: int) -> float:
        """Snapshot now (the state may change right after), write in the background.
        Returns the seconds the caller was held (waiting for a previous write included)."""
        t0 = time.perf_counter()
        if self._thread is not None and self._thread.is_alive():
            log.warning("checkpoint %s waits for the previous write to finish", path)
            self._thread.join()
        host, taken = snapshot(state_fn(), self.pool)
        held = time.perf_counter() - t0
        self._thread = threading.Thread(target=self._write,
                                        args=(host, taken, path, steps_done, held),
                                        name="checkpoint-writer", daemon=True)
        self._thread.start()
        return held

    def _write(self, host: Any, taken: list[torch.Tensor], path: Path, steps_done: int,
               held: float) -> None:
        t0 = time.perf_counter()
        record, error, code = None, None, None
        try:
            record = save_state(host, path)
        except Exception as exc:  # reported to the driver, which decides
            if not is_disk_full(exc):  # a full disk needs no traceback: the driver says it
                log.exception("checkpoint write %s failed", path)
            error = f"{type(exc).__name__}: {exc}"
            code = exc.errno if isinstance(exc, OSError) else None
        finally:
            del host
            self.pool.release(taken)
        done = SaveDone(str(path), steps_done, record, error, held, time.perf_counter() - t0,
                        code)
        with self._lock:
            self._finished.append(done)

    def done(self) -> tuple[SaveDone, ...]:
        """Writes finished since the last call (never blocks)."""
        with self._lock:
            out, self._finished = tuple(self._finished), []
        return out

    def wait(self) -> tuple[SaveDone, ...]:
        """Block until no write is in flight; then every finished one not yet handed back."""
        if self._thread is not None:
            self._thread.join()
        return self.done()
