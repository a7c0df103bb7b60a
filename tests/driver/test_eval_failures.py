"""Evaluator failures are loud: every tau evaluation's outcome is counted, each distinct error is
shown once, and a job whose every evaluation failed exits 1 after training and export.

Failures come from an EvalWorker subclass that hands itself weights of the wrong shape at
chosen steps (or at every one): a real ``load_state_dict`` error inside the real actor, as a
target whose cache the decoder cannot roll back gives one inside the decoder. (No setting
makes every evaluation fail on a healthy target: ``train.eval.max_new_tokens=1``, which leaves
no drafting round, is refused when the config is built.)
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import torch

from pipeline.driver.compose import compose_job
from pipeline.driver.eval_tally import EvalTally
from pipeline.driver.job import Driver, RunSummary
from pipeline.workers.eval_worker import EvalResult, EvalWorker
from pipeline.workers.weights import WeightsSnapshot

LOAD_ERROR = "Error(s) in loading state_dict"


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


# -- the tally, without Ray ----------------------------------------------------------------

def _result(step: int, error: str | None = None) -> EvalResult:
    return EvalResult(step=step, tau=math.nan if error else 2.5, num_prompts=2, seconds=0.1,
                      error=error)


def test_tally_counts_and_shows_each_error_once(caplog):
    tally = EvalTally(off=None)
    with caplog.at_level(logging.INFO, logger="pipeline.driver.eval_tally"):
        assert not tally.record(_result(0, "ValueError: boom"), "before training")
        assert tally.record(_result(2), "at step 2")
        assert not tally.record(_result(4, "ValueError: boom"), "at step 4")
        assert not tally.record(_result(6, "OSError: gone"), "after training")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "ValueError: boom" in warnings[0]
    assert "OSError: gone" in warnings[1]
    assert caplog.text.count("ValueError: boom") == 1, "a repeated error was shown again"
    assert (tally.done, tally.failed, tally.total) == (1, 3, 4) and not tally.all_failed
    assert tally.metrics() == {"eval/evaluations": 4, "eval/failures": 3}
    assert tally.first_error == "ValueError: boom" and tally.first_failed == "before training"
    assert tally.phrase(None, 2.5) == "tau evaluated 1 of 4 times (n/a -> 2.500)"


def test_tally_all_failed_and_eval_off():
    tally = EvalTally(off=None)
    tally.record(_result(0, "ValueError: boom"), "before training")
    tally.record(_result(3, "ValueError: boom"), "after training")
    assert tally.all_failed
    assert tally.never_line() == ("tau was never evaluated: all 2 tau evaluations failed (the "
                                  "first, before training, with the error shown above)")
    off = EvalTally(off="train.eval.every=-1")
    assert not off.all_failed and off.phrase(None, None) == \
        "tau not evaluated (train.eval.every=-1)"
    assert not EvalTally(off=None).all_failed  # nothing ran: nothing failed


def test_the_final_line_counts_evaluations(caplog):
    from pipeline.train import _report

    partial = EvalTally(off=None)
    for step, error in ((0, None), (2, "ValueError: boom"), (4, None)):
        partial.record(_result(step, error), f"at step {step}")
    never = EvalTally(off=None)
    never.record(_result(0, "ValueError: boom"), "before training")
    with caplog.at_level(logging.INFO, logger="pipeline.train"):
        assert _report(RunSummary(0, 4, 8, losses=[3.0, 2.0], tau_before=1.5, tau_after=2.5,
                                  evals=partial, export_dir="out/export")) == 0
        assert _report(RunSummary(0, 4, 8, evals=never, export_dir="out/export")) == 1
        assert _report(RunSummary(4, 4, 0, evals=never, nothing_to_train="all done")) == 0
    done, failed = [r.getMessage() for r in caplog.records if r.name == "pipeline.train"]
    assert done == ("done: 4 steps in 0.0s, loss 3.0000 -> 2.0000, tau evaluated 2 of 3 times "
                    "(1.500 -> 2.500), export out/export")
    assert failed.startswith("tau was never evaluated: all 1 tau evaluations failed")
    assert failed.endswith("(4 steps in 0.0s, no loss reported): export out/export is kept")


# -- some evaluations fail: in-process Driver runs -------------------------------------------

class FlakyEvalWorker(EvalWorker):
    """Evaluates the weights after the steps in ``bad_steps`` with a state dict of the wrong
    shape, so loading them fails inside the real worker."""

    bad_steps: tuple[int, ...] = (2, 4)

    def evaluate(self, weights, step: int) -> EvalResult:
        if self.bad_steps is None or step in self.bad_steps:
            names = [e.name for e in weights.layout] if isinstance(weights, WeightsSnapshot) \
                else list(weights)
            weights = {name: torch.zeros(1) for name in names}
        return super().evaluate(weights, step)


def _driver(worker: type, train_file: Path, out: Path, steps: int, every: int) -> Driver:
    """A one-drafter job evaluating tau every ``every`` steps on ``worker``."""
    driver = Driver(compose_job([
        "cluster.cpus_per_actor=0.5", "cluster.drafters_per_node=1",
        "train.export_dtype=float32", "data.micro_batch_size=2",
        f"train.plan.max_steps={steps}", "train.log_every=100", f"train.eval.every={every}",
        "train.eval.prompts=2", "train.eval.max_new_tokens=8",
        f"data.train_path={train_file}", f"train.out_dir={out}"]))
    driver.eval_worker = worker
    return driver


def test_partial_failures_are_counted_not_fatal(ray_session, small_train_file, tmp_path,
                                                caplog):
    out = tmp_path / "run"
    driver = _driver(FlakyEvalWorker, small_train_file, out, steps=6, every=2)
    with caplog.at_level(logging.INFO):
        summary = driver.run()

    evals = summary.evals
    assert (evals.done, evals.failed) == (2, 2) and not evals.all_failed
    assert evals.phrase(summary.tau_before, summary.tau_after).startswith(
        "tau evaluated 2 of 4 times")
    assert math.isfinite(summary.tau_before) and math.isfinite(summary.tau_after)
    assert evals.first_failed == "at step 2"
    assert "Error(s) in loading state_dict" in evals.first_error
    assert "\n" not in evals.first_error and "in load_state_dict)" in evals.first_error
    # shown once (at step 2); the failure at step 4 is counted and points back to it
    assert caplog.text.count("Error(s) in loading state_dict") == 1
    assert "tau at step 4 failed with the error of the evaluation at step 2" in caplog.text
    rows = _rows(out)
    assert [r["step"] for r in rows if "eval/tau" in r] == [0, 6]
    assert [(r["step"], r["eval/failures"]) for r in rows if "eval/failures" in r] == \
        [(0, 0), (2, 1), (4, 2), (6, 2)]
    summary_row = rows[-1]["summary"]
    assert (summary_row["eval/evaluations"], summary_row["eval/failures"]) == (4, 2)


class BrokenEvalWorker(FlakyEvalWorker):
    bad_steps = None  # every evaluation fails


def test_every_evaluation_failing_exits_1_after_training_and_export(ray_session,
                                                                   small_train_file, tmp_path,
                                                                   caplog):
    from pipeline.train import _report

    out = tmp_path / "run"
    driver = _driver(BrokenEvalWorker, small_train_file, out, steps=2, every=1)
    with caplog.at_level(logging.INFO):
        summary = driver.run()
        code = _report(summary)
    assert code == 1 and summary.evals.all_failed
    # before training, after step 1, after training: three evaluations, one error shown once
    assert caplog.text.count(LOAD_ERROR) == 1, caplog.text[-3000:]
    last = caplog.records[-1]
    assert last.levelno == logging.ERROR and last.name == "pipeline.train"
    line = last.getMessage()
    assert "tau was never evaluated: all 3 tau evaluations failed" in line, line
    assert f"export {out / 'export'}" in line and "checkpoints/step_00000002 are kept" in line
    assert (out / "export" / "model.safetensors").is_file()
    assert (out / "checkpoints" / "step_00000002" / "state.json").is_file()
    rows = _rows(out)
    assert [(r["step"], r["eval/failures"]) for r in rows if "eval/failures" in r] == \
        [(0, 1), (1, 2), (2, 3)]
    assert not [r for r in rows if "eval/tau" in r]
    summary_row = rows[-1]["summary"]
    assert (summary_row["eval/evaluations"], summary_row["eval/failures"]) == (3, 3)
    assert LOAD_ERROR in summary_row["eval/first_error"]


# -- the evaluator closes before the drafters ------------------------------------------------

class ManagerWatchingEvalWorker(EvalWorker):
    """Notes, as it closes, whether the shm manager of each ring it maps (drafter rank 0's
    weights ring, CPU shared memory) listens throughout a short watch: unmapping talks to it,
    and a manager gone with its drafter aborted the evaluator ("Broken pipe") in a demo run.
    The watch gives drafters that close meanwhile (the order before the fix) time to be gone;
    closed in order, they wait for this close and their managers live through it."""

    log_path: str = ""
    watch_s: float = 3.0

    def close(self) -> None:
        from pipeline.transport.shared import _unix_sockets

        sockets = [handle.payload.args[0].decode()
                   for handle, _ in self.reader._rings.values()]
        listening = {s: True for s in sockets}
        end = time.monotonic() + self.watch_s
        while all(listening.values()) and time.monotonic() < end:
            bound = {path for _, path in _unix_sockets()}
            listening = {s: s in bound for s in sockets}
            time.sleep(0.1)
        Path(self.log_path).write_text(json.dumps(listening))
        super().close()


def test_the_evaluator_lets_go_of_the_weights_ring_before_the_drafters_close(
        ray_session, small_train_file, tmp_path):
    out = tmp_path / "run"
    ManagerWatchingEvalWorker.log_path = str(tmp_path / "managers.json")
    driver = _driver(ManagerWatchingEvalWorker, small_train_file, out, steps=2, every=1)
    summary = driver.run()
    assert summary.evals.done == 3 and not summary.evals.failed
    managers = json.loads((tmp_path / "managers.json").read_text())
    assert len(managers) == 1, managers  # the weights ring was mapped
    assert all(managers.values()), managers
