"""bench/peers_steps/table.py: the table and the goals read from a result file."""

from bench.peers_steps.table import goals, markdown, rows


def _row(trainer, sps, tau_h, tau_e, status="ok", **extra):
    return {"trainer": trainer, "status": status, "samples_per_s": sps, "tokens_per_s": sps * 300.0,
            "time_to_first_step_s": 12.5, "peak_gpu_mib": 20480, "tau_humaneval": tau_h,
            "tau_explain": tau_e, **extra}


RESULT = {"device_name": "NVIDIA H100 80GB HBM3", "budget_min": 1.0, "scale": "gpu", "runs": {
    "ours_ce_decay": _row("ours", 120.0, 2.10, 1.90),
    "ours_dpace": _row("ours", 118.0, 2.30, 1.70),
    "modelopt_recipe": _row("modelopt", 50.0, 2.20, 1.80),
    "speculators_recipe": _row("speculators", 70.0, 1.50, 1.95),
    "speculators_our_shape": {"trainer": "speculators", "status": "failed",
                              "reason": "RuntimeError: CUDA out of memory"},
}}


def test_each_goal_takes_the_best_run_on_each_side():
    speed, humaneval, explain = goals(RESULT)
    # 120 / 70: the fastest peer, not the peer with the best tau
    assert speed.startswith("samples/s: ours_ce_decay 120.00 vs speculators_recipe 70.00, 1.71x")
    assert speed.endswith("not met)")
    assert humaneval == ("tau HumanEval: ours_dpace 2.30 vs modelopt_recipe 2.20, margin +0.10 "
                         "(goal >= 0: met)")
    assert explain.startswith("tau explain: ours_ce_decay 1.90 vs speculators_recipe 1.95, "
                              "margin -0.05") and explain.endswith("not met)")


def test_a_run_that_failed_shows_its_reason_and_counts_in_no_goal():
    table = {r[0]: r for r in rows(RESULT)}
    assert table["speculators_our_shape"][1] == "failed: RuntimeError: CUDA out of memory"
    assert table["modelopt_recipe"][1:] == ["50.00", "15,000", "12.5", "20,480", "2.20", "1.80"]
    text = markdown(RESULT)
    assert text.count("\n| ") == 1 + len(RESULT["runs"])  # the rule line, then a row a run
    assert "NVIDIA H100 80GB HBM3, 1.0 min of training a run" in text


def test_without_a_finished_peer_nothing_is_claimed():
    only_ours = {"runs": {k: v for k, v in RESULT["runs"].items() if v["trainer"] == "ours"}}
    assert all(line.endswith("(no peer run finished)") for line in goals(only_ours))
