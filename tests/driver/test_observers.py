"""The driver's per-step observers: their order, the non-finite count and abort, replicas."""

from types import SimpleNamespace

import pytest

from pipeline.driver.observers import (Listeners, MetricsRow, NonFiniteAbort, ReplicaCheck,
                                       StepObservers, step_observers)
from pipeline.driver.recovery import NonFiniteError
from pipeline.driver.summary import RunSummary


def _report(step, skipped=False, checksums=(1.0, 1.0)):
    results = [SimpleNamespace(skipped=skipped, grad_norm=float("nan") if skipped else 1.0,
                               param_checksum=c, on_main_thread=True, cudagraph_skips=0)
               for c in checksums]
    return SimpleNamespace(step=step, micro=[], results=results)


class _Recorder:
    def __init__(self, name, seen):
        self.name, self.seen = name, seen

    def on_step(self, report):
        self.seen.append((self.name, report.step))


def test_observers_run_in_their_order_for_every_step():
    seen = []
    observers = StepObservers([_Recorder(n, seen) for n in "abc"])
    observers(_report(0))
    observers(_report(1))
    assert seen == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("c", 1)]


def test_the_driver_observers_keep_the_documented_order():
    observers = step_observers(
        summary=RunSummary(0, 1, 8), recovery=None, accounting=None, saves=None,
        compile_mode="off", metrics=None, num_targets=1, progress=None, trace=None,
        cursor=None, job_plan=None, listeners=[], max_nonfinite_in_row=3)
    # Saves count only steps already accounted; the row is logged before progress reads it;
    # listeners (fault injection) see a step after everything else recorded it.
    assert [type(o).__name__ for o in observers.observers] == [
        "RecoveryTiming", "SampleCount", "SavesWritten", "ReplicaCheck", "MetricsRow",
        "ProgressLine", "TraceSteps", "EpochAccounts", "SavesReported", "Listeners",
        "NonFiniteAbort"]


def test_listeners_read_the_list_at_every_step():
    listeners, calls = [], []
    observer = Listeners(listeners)
    observer.on_step(_report(0))
    listeners.append(calls.append)  # a test adds one after the loop was built
    observer.on_step(_report(4))
    assert calls == [5]


def test_nonfinite_steps_in_a_row_abort_at_the_limit_and_a_finite_one_resets():
    summary = RunSummary(0, 10, 80)
    rows = MetricsRow(summary, metrics=None, num_targets=1)
    abort = NonFiniteAbort(rows, limit=2)
    for step, skipped in [(0, True), (1, False), (2, True)]:
        row = {}
        rows._check_finite(_report(step, skipped), row)
        abort.on_step(_report(step, skipped))
    assert rows.nonfinite_in_row == 1 and summary.skipped_steps == {1, 3}
    assert row["train/skipped_steps"] == 2
    rows._check_finite(_report(3, True), {})
    with pytest.raises(NonFiniteError, match=r"2 steps in a row \(up to step 4\).*"
                                             r"train.recovery.max_nonfinite_in_row=2"):
        abort.on_step(_report(3, True))


def test_drafters_disagreeing_on_a_skip_is_an_internal_error():
    report = _report(0)
    report.results[1].skipped = True
    with pytest.raises(AssertionError, match="drafters disagreed"):
        MetricsRow(RunSummary(0, 1, 8), None, 1)._check_finite(report, {})


def test_replica_check_sees_diverged_weights():
    summary = RunSummary(0, 2, 16)
    check = ReplicaCheck(summary, compile_mode="off")
    check.on_step(_report(0))
    assert summary.checksums_agree and summary.on_main_thread
    check.on_step(_report(1, checksums=(1.0, 1.5)))
    assert not summary.checksums_agree
