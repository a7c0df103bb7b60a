"""cluster.layout=auto: the split per node chosen from per-role rates, without Ray or GPUs."""

from __future__ import annotations

import json
import logging

import pytest

from pipeline.job.config import ClusterConfig, RatesConfig
from pipeline.driver.compose import compose_job
from pipeline.driver.launcher import check_gpu_layout
from pipeline.driver.layout import (Rates, choose_layout, colocated_rate, load_rates,
                                    node_gpu_count, plan_layout, predict_layout,
                                    predict_node_rate, write_profile)
from pipeline.eval.config import EvalConfig

EVAL_ON = EvalConfig(every=0, prompts=16, gpus=0.1)
EVAL_OFF = EvalConfig(every=-1)
B = Rates(11.2, 7.0, 3072, 2)  # docs/BENCHMARKS.md, H200, 3072 tokens: target, drafter alone


def _split(choice):
    return choice.colocated, choice.targets, choice.drafters


def test_target_bound_rates_give_more_targets():
    choice = choose_layout(B, 8, EVAL_ON)
    c = choice.chosen
    assert _split(c) == (False, 3, 5) and c.samples_per_s == pytest.approx(33.6)
    assert c.bound == "target" and c.idle == pytest.approx(1 - 33.6 / 35)
    assert _split(choice.runner_up) == (False, 4, 4)
    assert choice.runner_up.samples_per_s == pytest.approx(28.0)
    assert c.gpus_per_actor == pytest.approx(0.9)  # the evaluator beside any actor


def test_drafter_bound_rates_give_more_drafters():
    c = choose_layout(Rates(48.9, 14.8), 8, EVAL_ON).chosen  # shape A (4 x 800 tokens)
    assert _split(c) == (False, 2, 6) and c.samples_per_s == pytest.approx(6 * 14.8)
    assert c.bound == "drafter" and c.idle == pytest.approx(1 - 88.8 / 97.8)


def test_every_choice_passes_the_launchers_check():
    for rates in (B, Rates(48.9, 14.8), Rates(1.0, 100.0), Rates(5.0, 5.0)):
        for gpus in (1, 2, 3, 4, 8):
            for ev in (EVAL_ON, EVAL_OFF):
                c = choose_layout(rates, gpus, ev).chosen
                cluster = ClusterConfig(device="cuda", targets_per_node=c.targets,
                                        drafters_per_node=c.drafters,
                                        gpus_per_actor=c.gpus_per_actor)
                check_gpu_layout(cluster, ev, [gpus])


def test_one_gpu_is_co_located():
    choice = choose_layout(B, 1, EVAL_ON)
    c = choice.chosen
    assert _split(c) == (True, 1, 1) and choice.runner_up is None
    assert c.samples_per_s == pytest.approx(1 / (1 / 11.2 + 1 / 7.0))
    assert c.gpus_per_actor == pytest.approx(0.45) and c.bound == "shared"
    assert choose_layout(B, 1, EVAL_OFF).chosen.gpus_per_actor == pytest.approx(0.5)


def test_co_location_wins_the_prediction_when_the_roles_are_balanced():
    # Balanced roles on 3 GPUs: a split leaves one role with 2 GPUs for 1 GPU's work.
    choice = choose_layout(Rates(5.0, 5.0), 3, EVAL_ON)
    best = choice.candidates[0]
    assert best.colocated and best.samples_per_s == pytest.approx(7.5)
    # ... but on more than one GPU the launcher cannot keep drafters apart at <= 0.5 GPU, so
    # the best split is taken, and the log line names what was refused and why.
    assert best.refused and "drafters_per_node=3" in best.refused
    assert not choice.chosen.colocated and choice.chosen.samples_per_s == pytest.approx(5.0)
    assert choice.better_refused is best
    assert "not allowed by launcher.check_gpu_layout: 3 x (1 target + 1 drafter)" in \
        choice.log_line()


def test_ties_go_to_fewer_targets():
    # 2 GPUs, equal roles: 1 + 1 split and 2 co-located both predict 5.0.
    choice = choose_layout(Rates(5.0, 5.0), 2, EVAL_OFF)
    assert colocated_rate(2, Rates(5.0, 5.0)) == pytest.approx(5.0)
    assert _split(choice.chosen) == (False, 1, 1) and choice.chosen.bound == "balanced"
    # 4 GPUs, the target twice as fast: 1 + 3 gives min(10, 15) = 10, 2 + 2 min(20, 10) = 10.
    choice = choose_layout(Rates(10.0, 5.0), 4, EVAL_OFF)
    assert _split(choice.chosen) == (False, 1, 3) and _split(choice.runner_up) == (False, 2, 2)


def test_the_log_line_names_layout_rate_bound_role_and_runner_up():
    line = choose_layout(B, 8, EVAL_ON).log_line()
    assert line.startswith("cluster.layout=auto on 8 GPUs per node: 3 targets + 5 drafters, "
                           "gpus_per_actor=0.9, predicted 33.6 samples/s per node, "
                           "target-bound (drafters idle 4%)")
    assert "runner-up 4 targets + 4 drafters, gpus_per_actor=0.9 at 28.0 samples/s, " \
           "drafter-bound (targets idle 38%)" in line
    assert "8 x (1 target + 1 drafter) co-located, gpus_per_actor=0.45 at 34.5" in line
    assert "rates target 11.2, drafter 7 samples/s at 3072 tokens x 2" in line


def test_predict_node_rate():
    assert predict_node_rate(11.2, 7.0) == pytest.approx(33.6)  # 3 + 5 on 8 GPUs
    assert predict_node_rate(11.2, 7.0, gpus=1) == pytest.approx(1 / (1 / 11.2 + 1 / 7))
    assert predict_node_rate(48.9, 14.8, eval_gpus=None) == pytest.approx(88.8)
    with pytest.raises(ValueError, match="drafter_samples_per_s=0"):
        predict_node_rate(11.2, 0)


def test_the_node8_preset_is_not_bound_at_one_target():
    job = compose_job(config_name="qwen3_8b")  # cluster=node8, eval on
    assert job.cluster.layout == "auto"
    rates = load_rates(job.cluster.rates)
    planned = plan_layout(job, [{"GPU": 8.0, "CPU": 128.0}]).cluster
    check_gpu_layout(planned, job.train.eval, [8])
    assert (planned.layout, planned.targets_per_node, planned.drafters_per_node) == \
        ("manual", 3, 5)
    predicted = predict_layout(planned, rates).samples_per_s
    assert predicted == pytest.approx(33.6) and predicted > rates.target_samples_per_s
    # The manual fields are the same split, and the old 1 + 7 was bound at one target.
    assert predict_layout(job.cluster, rates).samples_per_s == pytest.approx(predicted)
    old = ClusterConfig(targets_per_node=1, drafters_per_node=7, gpus_per_actor=0.875)
    assert predict_layout(old, rates).samples_per_s == pytest.approx(11.2)


def test_plan_layout_logs_and_leaves_manual_and_cpu_alone(caplog):
    caplog.set_level(logging.INFO, logger="pipeline.driver.layout")
    job = compose_job(["cluster=node8"])  # the demo's shape (256 tokens x 4): a warning
    planned = plan_layout(job, [{"GPU": 4.0}])
    assert (planned.cluster.targets_per_node, planned.cluster.drafters_per_node) == (2, 2)
    assert "measured at data.max_length=3072" in caplog.text
    assert "cluster.layout=auto on 4 GPUs per node: 2 targets + 2 drafters" in caplog.text
    manual = compose_job(["cluster=node8", "cluster.layout=manual"])
    assert plan_layout(manual, [{"GPU": 8.0}]) is manual
    assert "cluster.layout=manual: 3 targets + 5 drafters" in caplog.text
    cpu = compose_job(["cluster.layout=auto", "cluster.rates.target_samples_per_s=2",
                       "cluster.rates.drafter_samples_per_s=1"])  # device auto, no GPU
    assert plan_layout(cpu, [{"CPU": 2.0}]) is cpu
    assert node_gpu_count([{"GPU": 8.0}, {"GPU": 4.0}, {}], 2) == 4
    assert node_gpu_count([{"GPU": 8.0}], 2) is None


def test_a_profile_round_trips_and_its_mistakes_name_the_key(tmp_path):
    path = tmp_path / "rates.json"
    write_profile(path, B, machine="nvidia-h200")
    assert json.loads(path.read_text())["machine"] == "nvidia-h200"
    rates = load_rates(RatesConfig(profile=str(path)))
    assert (rates.target_samples_per_s, rates.drafter_samples_per_s, rates.max_length) == \
        (11.2, 7.0, 3072)
    path.write_text('{"target_samples_per_s": 11.2}')
    with pytest.raises(ValueError, match=r"cluster.rates.profile=.*lacks \['drafter_samples"):
        load_rates(RatesConfig(profile=str(path)))
    with pytest.raises(ValueError, match=r"cluster.rates.profile=.*readable JSON"):
        load_rates(RatesConfig(profile=str(tmp_path / "missing.json")))


@pytest.mark.parametrize("overrides,match", [
    (["cluster.layout=fast"], r"cluster.layout='fast'.*\['manual', 'auto'\]"),
    (["cluster.layout=auto"], r"cluster.layout='auto'.*cluster.rates.target_samples_per_s"),
    (["cluster.rates.target_samples_per_s=3"], r"cluster.rates.drafter_samples_per_s=None.*"
                                               r"together"),
    (["cluster.rates.target_samples_per_s=-1", "cluster.rates.drafter_samples_per_s=1"],
     r"cluster.rates.target_samples_per_s=-1.*> 0"),
    (["cluster=node8", "cluster.rates.profile=/tmp/x.json"], r"cluster.rates.profile=.*one source"),
])
def test_config_mistakes_name_the_key(overrides, match):
    with pytest.raises(ValueError, match=match):
        compose_job(overrides)


def test_no_allowed_layout_names_the_evaluator_fraction():
    with pytest.raises(ValueError, match=r"no layout the launcher allows on 2 GPU.*"
                                         r"train.eval.gpus=0.6"):
        choose_layout(B, 2, EvalConfig(gpus=0.6))
