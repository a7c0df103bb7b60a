"""Where metrics go: a metrics.jsonl next to the run (always), the log, and wandb if chosen."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from pipeline.config import JobConfig

log = logging.getLogger(__name__)


class MetricsLogger:
    def __init__(self, job: JobConfig, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "metrics.jsonl"
        self.sink = open(self.path, "a")
        self.run: Optional[Any] = None
        if job.logger.kind == "wandb":
            self.run = _start_wandb(job, out_dir)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        row = {"step": step, **metrics}
        self.sink.write(json.dumps(row) + "\n")
        self.sink.flush()
        if self.run is not None:
            self.run.log(metrics, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        self.sink.write(json.dumps({"summary": values}) + "\n")
        self.sink.flush()
        if self.run is not None:
            self.run.summary.update(values)

    def close(self) -> None:
        self.sink.close()
        if self.run is not None:
            self.run.finish()


def _start_wandb(job: JobConfig, out_dir: Path) -> Any:
    import wandb

    run = wandb.init(project=job.logger.project, name=job.logger.name, mode=job.logger.mode,
                     dir=str(out_dir), config=asdict(job))
    # Steps are the x-axis of training curves; eval curves share it.
    run.define_metric("train/*", step_metric="trainer/step")
    run.define_metric("eval/*", step_metric="trainer/step")
    run.define_metric("perf/*", step_metric="trainer/step")
    return run
