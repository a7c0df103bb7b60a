"""Where metrics go: metrics.jsonl beside the run (always), and one wandb run per job.

wandb gets the resolved config and axes defined up front: every train/, perf/ and eval/
series is plotted against ``trainer/step``. A resumed job continues the same wandb run (its id
is kept in the out_dir).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from pipeline.job.config import JobConfig
from pipeline.runtime.diskfull import write_atomic, writing
from pipeline.runtime.wandb_env import wandb_init_switches

log = logging.getLogger(__name__)


class MetricsLogger:
    def __init__(self, job: JobConfig, out_dir: Path, resumed: bool = False) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "metrics.jsonl"
        with writing(self.path):
            # Unbuffered: a row is on disk once log() returns, and a failed one is undone.
            self.sink = open(self.path, "ab" if resumed else "wb", buffering=0)
        self.run: Optional[Any] = None
        if job.logger.kind == "wandb":
            self.run = _start_wandb(job, out_dir, resumed)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        # Wall-clock time on every row: start-up, stalls and restarts read straight off it.
        self._append({"step": step, "time": time.time(), **metrics})
        if self.run is not None:
            self.run.log(metrics)

    def summary(self, values: dict[str, Any]) -> None:
        self._append({"summary": values})
        if self.run is not None:
            self.run.summary.update({k: v for k, v in values.items() if v is not None})

    def _append(self, row: dict[str, Any]) -> None:
        """One whole row, or (a full disk: DiskFullError) the file cut back to the rows
        before it: a cut-off row would break every line a resumed job appends after it."""
        data = memoryview((json.dumps(row) + "\n").encode())
        end = self.sink.seek(0, os.SEEK_END)
        try:
            with writing(self.path):
                while data:
                    data = data[self.sink.write(data):]
        except OSError:
            with contextlib.suppress(OSError):
                self.sink.truncate(end)
            raise

    def close(self) -> None:
        self.sink.close()
        if self.run is not None:
            self.run.finish()


def _start_wandb(job: JobConfig, out_dir: Path, resumed: bool) -> Any:
    import wandb

    id_file = out_dir / "wandb_run_id"
    run_id = id_file.read_text().strip() if resumed and id_file.exists() else None
    run = wandb.init(**wandb_init_switches(job.logger), dir=str(out_dir), config=asdict(job),
                     id=run_id, resume="allow" if run_id else None, **job.logger.wandb_init)
    write_atomic(id_file, run.id)
    run.define_metric("trainer/step")
    for prefix in ("train/*", "perf/*", "eval/*"):
        run.define_metric(prefix, step_metric="trainer/step")
    return run
