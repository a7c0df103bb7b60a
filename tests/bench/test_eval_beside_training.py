import pytest
"""bench.eval_beside_training at the tiny shape on CPU: a trainer and an evaluator, two
processes, go through every phase (alone, then beside the evaluator at each duty), and the
result says what each did."""

import json
import re

from bench import eval_beside_training


@pytest.mark.slow
def test_trainer_times_steps_alone_and_beside_a_running_evaluator(tmp_path):
    out = tmp_path / "beside.json"
    result = eval_beside_training.main([
        "--shape", "tiny", "--device", "cpu", "--steps", "2", "--warmup", "1",
        "--duties", "0.5,1.0", "--eval-prompts", "2", "--eval-batch", "2",
        "--eval-new-tokens", "4", "--work", str(tmp_path / "work"), "--out", str(out),
        "--timeout", "600"])
    assert json.loads(out.read_text()) == result and "error" not in result
    assert set(result["phases"]) == {"alone", "beside_duty_0.5", "beside_duty_1.0"}
    assert all(p["steps"] == 2 and p["median_ms"] > 0 for p in result["phases"].values())
    assert set(result["slowdown_vs_alone"]) == {"beside_duty_0.5", "beside_duty_1.0"}
    assert set(result["slowdown_mean_vs_alone"]) == {"beside_duty_0.5", "beside_duty_1.0"}
    # The evaluator was decoding during each beside phase (rounds after its start signal).
    assert all(result["evaluator"][d]["rounds"] >= 1 for d in ("0.5", "1.0"))
    # What stays in the work folder is logs and figures, not the roles' handshakes.
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == [
        "eval.log", "evaluator.json", "train.log", "trainer.json"]


def test_slowdown_is_reported_by_median_and_by_mean(tmp_path):
    """A phase whose median matches the alone phase but whose mean does not (a few slow steps,
    as beside an evaluator's prefill chunk) shows in the mean's slowdown, not the median's."""
    phases = {"alone": {"median_ms": 100.0, "mean_ms": 100.0},
              "beside_duty_0.15": {"median_ms": 101.0, "mean_ms": 110.0}}
    (tmp_path / "trainer.json").write_text(json.dumps({"phases": phases}))
    result = eval_beside_training._summary(tmp_path)
    assert result["slowdown_vs_alone"] == {"beside_duty_0.15": 0.01}
    assert result["slowdown_mean_vs_alone"] == {"beside_duty_0.15": 0.1}


@pytest.mark.slow
def test_a_failed_role_names_its_cause_in_the_error(tmp_path):
    """A role that fails puts its log's last line (the exception) into the result's error:
    on the H100 (2026-12-05) the roles' logs did not come back and "rc 1" was all there was."""
    result = eval_beside_training.main([
        "--shape", "tiny", "--device", "nosuch", "--steps", "1", "--warmup", "1",
        "--work", str(tmp_path / "work"), "--timeout", "300"])
    # Whichever role fails first, the other is stopped: either may carry the cause.
    assert re.search(r"(train|eval): RuntimeError: Expected one of cpu.* device string: "
                     r"nosuch", result["error"]), result["error"]
