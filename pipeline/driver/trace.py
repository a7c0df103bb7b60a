"""A Chrome/Perfetto trace of per-actor spans over a window of steps.

Open ``<out_dir>/trace.json`` in https://ui.perfetto.dev or chrome://tracing: one row per
actor, with target forwards, slot waits (ready until a drafter took it), drafter
forward/backward and optimizer steps (with the all-reduce inside them).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipeline.runtime.diskfull import write_atomic
from pipeline.driver.scheduler import StepReport

log = logging.getLogger(__name__)


class TraceRecorder:
    def __init__(self, first: int, num_steps: int) -> None:
        self.window = range(first, first + num_steps)
        self.events: list[dict] = []
        self.steps: list[int] = []  # the steps (0-based) recorded, in order

    def _span(self, name: str, actor: str, start_s: float, dur_s: float, step: int) -> None:
        self.events.append({"name": name, "ph": "X", "pid": actor, "tid": actor,
                            "ts": start_s * 1e6, "dur": max(dur_s, 0.0) * 1e6,
                            "args": {"step": step + 1}})

    def add(self, report: StepReport) -> None:
        if report.step not in self.window:
            return
        self.steps.append(report.step)
        for ready in report.produced:
            self._span("target forward", f"target{ready.target_rank}", ready.meta.start_s,
                       ready.meta.busy_s, report.step)
        for wait in report.slot_waits:
            self._span("slot wait", f"ring of target{wait.target}", wait.ready_at,
                       wait.taken_at - wait.ready_at, report.step)
        for m in report.micro:
            self._span("drafter fwd+bwd", f"drafter{m.drafter}", m.start_s, m.busy_s,
                       report.step)
        for r in report.results:
            self._span("optimizer step", f"drafter{r.drafter}", r.start_s, r.busy_s,
                       report.step)
            self._span("all-reduce", f"drafter{r.drafter}", r.reduce_start_s, r.reduce_s,
                       report.step)

    def write(self, path: Path) -> Path | None:
        """Whole or not at all: a full disk leaves no empty or cut-off trace.json. Logs the
        steps it holds: those run, which a short or resumed run makes fewer than the window."""
        if not self.events:
            return None
        written = write_atomic(path, json.dumps({"traceEvents": self.events,
                                                 "displayTimeUnit": "ms"}))
        first, last = min(self.steps) + 1, max(self.steps) + 1
        log.info("trace of step%s: %s", f"s {first}..{last}" if last > first else f" {first}",
                 written)
        return written
