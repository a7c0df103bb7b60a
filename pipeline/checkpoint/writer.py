"""Checkpoint saves off the training loop: a host snapshot, then a background write.

Every drafter rank enters a save at the step boundary. Its main thread only copies its part of
the state into host buffers (pipeline/checkpoint/host_copy.py) and returns to training; a
writer thread hands the copy to DCP (pipeline/checkpoint/sharded.py), whose planning and
closing exchange run on the checkpoint's own gloo group. The owner's thread then writes the
rank-independent rest (``trainer.pt``: scheduler, steps done, RNG) and records every file's
size and sha256, read back from disk, for the checkpoint's state.json. Only the owner reports
the finished save: DCP's closing exchange returns on the owner once every rank's files are
written, and raises there if any rank's write failed, so its report covers the whole group.
The checkpoint counts only once that report arrived (the driver renames it into place then).

The writer thread touches no GPU and runs no model code: the actor's compute still runs on its
main thread, where CUDA-graph state lives. A save waits for the previous one to finish before
it reuses the host buffers.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Optional

import torch.distributed as dist

from pipeline.checkpoint.files import FileRecord, save_state, sha256_files
from pipeline.checkpoint.host_copy import HostPool, map_tensors, snapshot
from pipeline.runtime.diskfull import is_disk_full

# pipeline.checkpoint.sharded (DCP: torch.distributed.tensor, most of a CPU-second to import)
# is imported where a drafter writes, not here: every actor and the driver import this module
# (SaveDone travels in the workers' messages), and only drafters write.

log = logging.getLogger(__name__)

TRAINER_FILE = "trainer.pt"


def checkpoint_group(timeout_s: float) -> dist.ProcessGroup:
    """A gloo group over the default group's ranks, for DCP's collectives (a collective: every
    rank, when the default group is formed). Gloo runs on host memory, so a save's planning and
    its closing exchange can run in a background thread under NCCL training; and being its own
    group, they never interleave with the step loop's collectives."""
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


@dataclass(frozen=True)
class SaveDone:
    """A background save that finished: its files' records, or why it failed."""

    path: str  # the checkpoint's (staging) folder
    steps_done: int
    records: tuple[FileRecord, ...]  # names relative to the folder
    error: Optional[str]
    snapshot_s: float  # what the save cost the training loop (the host copy)
    write_s: float     # serialise + fsync + read-back, in the background
    errno: Optional[int] = None  # of the OSError the write failed with (ENOSPC: disk full)
    file: Optional[str] = None   # what the failed write was writing (a file, or DCP's folder)


class AsyncSaver:
    """One rank's saves, run one at a time in a writer thread; :meth:`done` hands back the
    owner's finished ones.

    ``pool``: the host buffers snapshots copy into; None for a rank whose part is written by
    another (a replica other than rank 0): it plans with its live tensors, which it never
    reads. ``group``: DCP's process group (None: a single process, no group). ``threads``:
    the files each rank writes at once (train.checkpoint.write_threads), and read back at once.
    """

    def __init__(self, pool: Optional[HostPool], group: Optional[dist.ProcessGroup],
                 owner: bool, threads: int = 1) -> None:
        self.pool = pool
        self.group = group
        self.owner = owner
        self.threads = threads
        self._thread: Optional[threading.Thread] = None
        self._finished: list[SaveDone] = []
        self._lock = threading.Lock()

    def start(self, drafter_fn: Callable[[], dict], trainer_fn: Callable[[], dict],
              folder: Path, steps_done: int) -> float:
        """Snapshot now (the state may change right after), write in the background.
        ``drafter_fn``: the weights and AdamW state (DCP); ``trainer_fn``: the owner's
        rank-independent rest. Returns the seconds the caller was held (waiting for a
        previous write included)."""
        t0 = time.perf_counter()
        if self._thread is not None and self._thread.is_alive():
            log.warning("checkpoint %s waits for the previous write to finish", folder)
            self._thread.join()
        state, taken = drafter_fn(), []
        if self.pool is not None:
            state, taken = snapshot(state, self.pool)
        # Small (scheduler, RNG): copied so that training's next step cannot change it.
        rest = map_tensors(trainer_fn(), lambda t: t.clone()) if self.owner else None
        held = time.perf_counter() - t0
        self._thread = threading.Thread(target=self._write,
                                        args=(state, taken, rest, folder, steps_done, held),
                                        name="checkpoint-writer", daemon=True)
        self._thread.start()
        return held

    def _write(self, state: Any, taken: list, rest: Optional[dict], folder: Path,
               steps_done: int, held: float) -> None:
        from pipeline.checkpoint import sharded  # a drafter's import (see the top)

        t0 = time.perf_counter()
        records: tuple[FileRecord, ...] = ()
        error, code, file = None, None, None
        try:
            sharded.save(state, folder, self.group, self.threads)
            if rest is not None:
                records = (save_state(rest, folder / TRAINER_FILE),
                           *_records(folder, self.threads))
        except Exception as exc:  # reported to the driver, which decides
            if not is_disk_full(exc):  # a full disk needs no traceback: the driver says it
                log.exception("checkpoint write %s failed", folder, exc_info=exc)
            error = f"{type(exc).__name__}: {exc}"
            code = exc.errno if isinstance(exc, OSError) else None
            # DCP's own writes raise without a file name: its folder is what failed.
            file = getattr(exc, "filename", None) or str(folder / sharded.DRAFTER_DIR)
        finally:
            del state
            if self.pool is not None:
                self.pool.release(taken)
        if not self.owner:
            return  # the owner's report covers this rank's files (see the module docstring)
        done = SaveDone(str(folder), steps_done, records, error, held,
                        time.perf_counter() - t0, code, file)
        with self._lock:
            self._finished.append(done)

    def done(self) -> tuple[SaveDone, ...]:
        """Saves finished since the last call (never blocks)."""
        with self._lock:
            out, self._finished = tuple(self._finished), []
        return out

    def wait(self) -> tuple[SaveDone, ...]:
        """Block until no write is in flight; then every finished one not yet handed back."""
        if self._thread is not None:
            self._thread.join()
        return self.done()


def _records(folder: Path, threads: int) -> list[FileRecord]:
    """Size and sha256 of every file DCP wrote under ``folder`` (all ranks'), read back,
    ``threads`` files at once."""
    from pipeline.checkpoint import sharded  # a drafter's import (see the top)

    files = [p for p in sorted((folder / sharded.DRAFTER_DIR).rglob("*")) if p.is_file()]
    return [FileRecord(p.relative_to(folder).as_posix(), p.stat().st_size, digest)
            for p, digest in zip(files, sha256_files(files, threads))]
