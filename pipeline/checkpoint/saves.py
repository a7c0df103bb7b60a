"""The driver's side of checkpoints: queue a save behind a step, count it once it is written,
verified and its step reported, and keep track of the newest one (where a restart resumes).

Every drafter rank snapshots its part of the state into host memory and writes it in the
background (pipeline/checkpoint/writer.py); the owner rank reports the finished save, which
covers every rank's files. This class turns each finished save into a checkpoint folder
(pipeline/checkpoint/folders.py).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from pipeline.checkpoint import folders as ckpt
from pipeline.checkpoint.cursor import Cursor
from pipeline.checkpoint.point import ResumePoint
from pipeline.checkpoint.writer import SaveDone
from pipeline.runtime.diskfull import DISK_FULL, disk_full_error

log = logging.getLogger(__name__)


class Drafters(Protocol):
    """The drafter group as saves use it (pipeline/driver/drafter_group.py)."""

    def save_checkpoint_ref(self, folder: str) -> Any:
        """ObjectRef of the seconds the snapshot held training; the write goes on beside."""
        ...

    def wait_saves(self) -> tuple[SaveDone, ...]: ...


class CheckpointSaves:
    def __init__(self, out_dir: Path, keep_last: int, extra: Callable[[], dict],
                 last: Optional[Path]) -> None:
        """``extra``: what state.json holds beside the resume point (config, resume contract)."""
        self.out_dir = out_dir
        self.keep_last = keep_last
        self.extra = extra
        self.last = last  # the newest counted checkpoint: where a restart resumes
        self.counted: list[str] = []  # every checkpoint counted, in order (see start)
        # Writes in flight: staging folder -> resume point.
        self._writing: dict[str, ResumePoint] = {}
        self._steps_reported = 0
        # Written, their step not yet reported: (staging folder, resume point, the write).
        self._unreported: list[tuple[Path, ResumePoint, SaveDone]] = []

    def start(self, first_step: int, counted: list[str]) -> None:
        """A (re)started step loop: nothing of an earlier actor set is still coming.
        ``counted`` (the run summary's list) gets every checkpoint from now on."""
        self.counted = counted
        self._writing.clear()  # writes in flight died with the drafters that wrote them
        self._unreported = []
        self._steps_reported = first_step

    def save_async(self, drafters: Drafters, cursor: Cursor, step: int) -> Any:
        """Save at a step: queue a checkpoint on the drafters right behind step ``step``; the
        state is snapshot to host memory and written in the background (see
        :meth:`on_saved`). The ref of the seconds the snapshot held training; its value comes
        back again with the save's record and is logged when the checkpoint counts."""
        staging = ckpt.staging_dir(self.out_dir, step + 1)
        self._writing[str(staging)] = cursor.after(step)
        return drafters.save_checkpoint_ref(str(staging))

    def on_saved(self, done: SaveDone) -> None:
        """A background write finished: the checkpoint counts once its step is reported."""
        point = self._writing.pop(done.path)
        staging = Path(done.path)
        if done.error is not None:
            raise self._failed(done, staging)
        # Renamed into place only once its step is reported: a restart resumes from the
        # newest checkpoint, and the accounting must already hold every step it covers.
        self._unreported.append((staging, point, done))
        self.reported(self._steps_reported)

    def reported(self, steps: int) -> None:
        """The driver has accounted for ``steps`` steps: count the writes they cover."""
        self._steps_reported = steps
        ready = [u for u in self._unreported if u[1].step <= steps]
        self._unreported = [u for u in self._unreported if u[1].step > steps]
        for staging, point, done in ready:
            self._finalize(staging, point, done)

    def save_now(self, drafters: Drafters, cursor: Cursor) -> Path:
        """A checkpoint of the drafters' state as it is now (the loop has stopped)."""
        staging = ckpt.staging_dir(self.out_dir, cursor.plan.end_step)
        drafters.wait_saves()  # a write still in flight is superseded
        import ray  # here only: the package imports without Ray (a GPU bench of the writer)

        ray.get(drafters.save_checkpoint_ref(str(staging)))
        (done,) = drafters.wait_saves()
        if done.error is not None:
            raise self._failed(done, staging)
        return self._finalize(staging, cursor.after(done.steps_done - 1), done)

    def _failed(self, done: SaveDone, staging: Path) -> Exception:
        """The error a failed write raises; its staging folder (a partial file) goes first."""
        ckpt.discard(staging)
        if done.errno in DISK_FULL:
            return disk_full_error(done.file or done.path, done.errno)
        return RuntimeError(f"checkpoint write {done.file or done.path} failed: {done.error}; "
                            f"the previous checkpoint ({self.last}) is intact")

    def _finalize(self, staging: Path, point: ResumePoint, saved: SaveDone) -> Path:
        assert saved.steps_done == point.step, f"saved {saved.steps_done} steps, cursor {point}"
        assert saved.records, f"a finished save of {staging} without file records"
        final = ckpt.finalize(staging, point, list(saved.records), self.extra(), self.keep_last)
        self.counted.append(str(final))
        self.last = final
        log.info("checkpoint %s (held training %.2fs, written and verified in %.1fs beside "
                 "it)", final, saved.snapshot_s, saved.write_s)
        return final
