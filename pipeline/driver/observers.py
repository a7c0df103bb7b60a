"""What the driver does with each finished step: small observers, each with one job.

The step loop hands every :class:`StepReport` to :class:`StepObservers`, which calls its
observers in the order :func:`step_observers` lists them. The order is part of the behaviour
(the logs and metrics.jsonl show it):

1. recovery timing: after a restart, the first step done is logged once;
2. sample accounting: the step's samples are counted per epoch;
3. finished checkpoint writes are counted (renamed into place once their step is reported);
4. replica checks: every drafter on the main thread with the same weights; CUDA-graph skips;
5. the metrics row: built, the non-finite check adds to it, then it is logged;
6. progress: the bar or the periodic log line, from that row;
7. trace: the step's spans, when it is one of the traced steps;
8. epoch accounts: at an epoch's end (or the job's last step) its account is logged;
9. the step is reported to the saves, which counts the checkpoints it covers;
10. listeners (``Driver.step_listeners``: monitoring, fault injection);
11. abort when too many steps in a row had a non-finite update.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional, Protocol, Sequence

from pipeline.checkpoint import CheckpointSaves
from pipeline.checkpoint.cursor import Cursor
from pipeline.driver.accounting import SampleAccounting
from pipeline.driver.progress import Progress
from pipeline.driver.recovery import NonFiniteError, Recovery
from pipeline.driver.report import step_metrics
from pipeline.driver.scheduler import StepReport
from pipeline.driver.summary import RunSummary
from pipeline.driver.telemetry import MetricsLogger
from pipeline.driver.trace import TraceRecorder
from pipeline.workers.prefetcher import PlanSummary

log = logging.getLogger(__name__)


class StepObserver(Protocol):
    def on_step(self, report: StepReport) -> None: ...


class StepObservers:
    """The step loop's ``on_step``: every observer in order."""

    def __init__(self, observers: Sequence[StepObserver]) -> None:
        self.observers = list(observers)

    def __call__(self, report: StepReport) -> None:
        for observer in self.observers:
            observer.on_step(report)


class RecoveryTiming:
    """After a restart, logs how long after the loss training went on."""

    def __init__(self, recovery: Optional[Recovery]) -> None:
        self.recovery = recovery

    def on_step(self, report: StepReport) -> None:
        recovery = self.recovery
        if recovery is not None and not recovery.training_at:
            recovery.training_at = time.time()
            log.info("training again: step %d done %.1fs after %s was lost", report.step + 1,
                     recovery.training_at - recovery.detected_at, recovery.actor)


class SampleCount:
    def __init__(self, accounting: SampleAccounting) -> None:
        self.accounting = accounting

    def on_step(self, report: StepReport) -> None:
        for m in report.micro:
            self.accounting.add(m.epoch, m.sample_ids, report.step)


class SavesWritten:
    """Background checkpoint writes the drafters reported as finished with this step."""

    def __init__(self, saves: CheckpointSaves) -> None:
        self.saves = saves

    def on_step(self, report: StepReport) -> None:
        for result in report.results:
            for done in result.saves:
                self.saves.on_saved(done)


class ReplicaCheck:
    """Every drafter replica ran on its main thread and holds the same weights."""

    def __init__(self, summary: RunSummary, compile_mode: str) -> None:
        self.summary = summary
        self.compile_mode = compile_mode

    def on_step(self, report: StepReport) -> None:
        summary = self.summary
        summary.on_main_thread &= all(m.on_main_thread for m in report.micro)
        summary.on_main_thread &= all(res.on_main_thread for res in report.results)
        summary.checksums_agree &= len({round(r.param_checksum, 6) for r in report.results}) == 1
        skips = max(res.cudagraph_skips for res in report.results)
        if skips and self.compile_mode == "reduce-overhead" and not summary.graph_warned:
            summary.graph_warned = True
            log.warning("drafter.compile=reduce-overhead, but inductor skipped %d CUDA "
                        "graph(s): see TORCH_LOGS=perf_hints for why", skips)


class MetricsRow:
    """Builds the step's metrics row, counts a non-finite (skipped) update into it, logs it."""

    def __init__(self, summary: RunSummary, metrics: MetricsLogger, num_targets: int) -> None:
        self.summary = summary
        self.metrics = metrics
        self.num_targets = num_targets
        self.row: dict = {}  # the last step's row (the progress line reads it)
        self.nonfinite_in_row = 0  # a restart starts a new step loop, and this count, at 0

    def on_step(self, report: StepReport) -> None:
        row = step_metrics(report, self.num_targets)
        row["trainer/step"] = report.step + 1
        self._check_finite(report, row)
        self.summary.losses.append(row["train/loss"])
        self.metrics.log(row, report.step + 1)
        self.row = row

    def _check_finite(self, report: StepReport, row: dict) -> None:
        """Count a skipped (non-finite) update; every drafter must have decided alike."""
        skipped_steps = self.summary.skipped_steps
        skipped = {r.skipped for r in report.results}
        assert len(skipped) == 1, f"step {report.step + 1}: drafters disagreed on skipping"
        if skipped.pop():
            self.nonfinite_in_row += 1
            skipped_steps.add(report.step + 1)
            log.warning("step %d: non-finite loss or gradient (grad norm %s): update skipped "
                        "on every drafter (%d in a row, %d in this job)", report.step + 1,
                        report.results[0].grad_norm, self.nonfinite_in_row, len(skipped_steps))
        else:
            self.nonfinite_in_row = 0
        row["train/skipped_steps"] = len(skipped_steps)


class ProgressLine:
    def __init__(self, progress: Progress, rows: MetricsRow) -> None:
        self.progress = progress
        self.rows = rows

    def on_step(self, report: StepReport) -> None:
        self.progress.update(report.step + 1, self.rows.row)


class TraceSteps:
    def __init__(self, trace: TraceRecorder) -> None:
        self.trace = trace

    def on_step(self, report: StepReport) -> None:
        self.trace.add(report)


class EpochAccounts:
    """At an epoch's end, or the loop's last step, the epoch's sample account is logged."""

    def __init__(self, summary: RunSummary, accounting: SampleAccounting, cursor: Cursor,
                 job_plan: PlanSummary) -> None:
        self.summary = summary
        self.accounting = accounting
        self.cursor = cursor
        self.job_plan = job_plan

    def on_step(self, report: StepReport) -> None:
        if self.cursor.epoch_ends_at(report.step) or report.step + 1 == self.summary.end_step:
            account = self.accounting.account(report.epoch,
                                              self.job_plan.samples_planned(report.epoch))
            self.summary.accounts.append(account)
            log.info("%s", account.summary())


class SavesReported:
    """The step is accounted for: the checkpoints it covers count now."""

    def __init__(self, saves: CheckpointSaves) -> None:
        self.saves = saves

    def on_step(self, report: StepReport) -> None:
        self.saves.reported(report.step + 1)


class Listeners:
    """Calls each listener with the steps done (the list is read at every step)."""

    def __init__(self, listeners: list[Callable[[int], None]]) -> None:
        self.listeners = listeners

    def on_step(self, report: StepReport) -> None:
        for listener in self.listeners:
            listener(report.step + 1)


class NonFiniteAbort:
    """Stops the job after ``limit`` non-finite updates in a row."""

    def __init__(self, rows: MetricsRow, limit: int) -> None:
        self.rows = rows
        self.limit = limit

    def on_step(self, report: StepReport) -> None:
        in_row = self.rows.nonfinite_in_row
        if in_row >= self.limit:
            raise NonFiniteError(
                f"{in_row} steps in a row (up to step {report.step + 1}) had a non-finite "
                f"loss or gradient (train.recovery.max_nonfinite_in_row={self.limit}); check "
                f"the data and train.optim.lr")


def step_observers(*, summary: RunSummary, recovery: Optional[Recovery],
                   accounting: SampleAccounting, saves: CheckpointSaves, compile_mode: str,
                   metrics: MetricsLogger, num_targets: int, progress: Progress,
                   trace: TraceRecorder, cursor: Cursor, job_plan: PlanSummary,
                   listeners: list[Callable[[int], None]],
                   max_nonfinite_in_row: int) -> StepObservers:
    """One step loop's observers, in the order the module docstring gives."""
    rows = MetricsRow(summary, metrics, num_targets)
    return StepObservers([
        RecoveryTiming(recovery),
        SampleCount(accounting),
        SavesWritten(saves),
        ReplicaCheck(summary, compile_mode),
        rows,
        ProgressLine(progress, rows),
        TraceSteps(trace),
        EpochAccounts(summary, accounting, cursor, job_plan),
        SavesReported(saves),
        Listeners(listeners),
        NonFiniteAbort(rows, max_nonfinite_in_row),
    ])
