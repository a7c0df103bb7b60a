"""bench/quality: curves read back from what the trainers write, and the curve data files."""

import csv
import json
from pathlib import Path

import pytest

from bench.quality.plot import write_curve_data
from bench.quality.runs import read_pipeline, read_single
from pipeline.job.config import JobConfig
from pipeline.driver.telemetry import MetricsLogger
from pipeline.training.metrics import StepTotals, metrics_dict


def _totals(step: int) -> StepTotals:
    # Block 4: position 0 is never scored; positions 1..3 get better with the step.
    return StepTotals(numerator=10.0 / step, denominator=5.0,
                      correct=[0.0, step, step / 2, step / 4], total=[0.0, 10, 10, 10],
                      samples=2, tokens=40)


def test_pipeline_curves_from_its_metrics_file(tmp_path: Path):
    sink = MetricsLogger(JobConfig(), tmp_path)  # the driver's own writer
    sink.log({"eval/tau": 1.1, "trainer/step": 0}, 0)
    for step in (1, 2, 3):
        sink.log({**metrics_dict(_totals(step)), "trainer/step": step}, step)
    sink.log({"eval/tau": 2.5, "trainer/step": 3}, 3)
    sink.summary({"tau_after": 2.5})
    sink.close()
    curves = read_pipeline(tmp_path)
    assert curves.steps == [1, 2, 3] and curves.tau_steps == [0, 3]
    assert curves.final_tau == 2.5 and curves.loss[0] == 2.0
    assert curves.position_accuracy[2] == pytest.approx([0.3, 0.15, 0.075])
    assert curves.final_position_accuracy(last=2) == pytest.approx([0.25, 0.125, 0.0625])


def test_reference_curves_take_tau_from_its_closing_log_line(tmp_path: Path):
    rows = [{"step": s, "epoch": 0, "lr": 1e-3, **metrics_dict(_totals(s))} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = tmp_path / "reference.log"
    # The format of pipeline/train_single.py's closing line.
    log.write_text("[x][__main__][INFO] - done: 2 steps, loss 2.0000 -> 1.0000, accuracy "
                   "0.100 -> 0.200, tau 1.020 -> 3.140\n")
    curves = read_single(tmp_path, log)
    assert curves.steps == [1, 2] and curves.tau_steps == [0, 2] and curves.tau == [1.02, 3.14]


def test_reference_curves_merge_tau_between_steps_with_the_closing_line(tmp_path: Path):
    rows = [{"step": s, "epoch": 0, "lr": 1e-3, **metrics_dict(_totals(s))} for s in (1, 2, 3)]
    rows.insert(2, {"step": 2, "eval/tau": 1.5})  # as the reference trainer writes it
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = tmp_path / "reference.log"
    log.write_text("[x][__main__][INFO] - done: 3 steps, loss 2.0000 -> 1.0000, accuracy "
                   "0.100 -> 0.200, tau 1.020 -> 3.140\n")
    curves = read_single(tmp_path, log)
    assert curves.steps == [1, 2, 3] and curves.tau_steps == [0, 2, 3]
    assert curves.tau == [1.02, 1.5, 3.14] and curves.final_tau == 3.14


def test_a_run_stopped_midway_reads_what_it_wrote(tmp_path: Path):
    row = {"step": 1, **metrics_dict(_totals(1))}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(row) + "\n" + '{"step": 2, "trai')
    curves = read_single(tmp_path, tmp_path / "missing.log")
    assert curves.steps == [1] and curves.final_tau is None


def test_curve_data_has_every_step_and_tau(tmp_path: Path):
    sink = MetricsLogger(JobConfig(), tmp_path)
    sink.log({"eval/tau": 1.0, "trainer/step": 0}, 0)
    sink.log({**metrics_dict(_totals(1)), "trainer/step": 1}, 1)
    sink.log({"eval/tau": 2.0, "trainer/step": 1}, 1)
    sink.close()
    curves = read_pipeline(tmp_path)
    write_curve_data({"pipeline": curves}, tmp_path)
    table = list(csv.DictReader(open(tmp_path / "curves.csv")))
    assert [(r["step"], r["eval_tau"]) for r in table] == [("1", "2.0"), ("0", "1.0")]
    assert json.loads((tmp_path / "curves.json").read_text())["pipeline"]["tau"] == [1.0, 2.0]
