"""bench.e2e_8b's figures from a run's rows and log: start-up, stalls, the kill, efficiency,
and resumed_ok only when the repeated steps' losses match."""

from bench.e2e_8b import _summarise


def _rows(repeat_loss_shift: float = 0.0):
    """200 steps of 0.5 s from t=100; after step 110 a kill, 20 s of restart, steps 101..110
    again; step 101 (right after the checkpoint at 100) takes 1.5 s."""
    rows, t = [], 100.0
    for step in range(1, 111):
        t += 1.5 if step == 101 else 0.5
        rows.append({"step": step, "time": t, "train/loss": 10.0 / step,
                     "perf/step_time_s": 1.5 if step == 101 else 0.5})
    kill = t + 0.1
    t += 20.0
    for step in range(101, 201):
        t += 0.5
        loss = 10.0 / step + (repeat_loss_shift if step <= 110 else 0.0)
        rows.append({"step": step, "time": t, "train/loss": loss, "perf/step_time_s": 0.5})
    rows.append({"step": 100, "time": t, "eval/tau": 1.2})
    return rows, kill, t


LOG = ("checkpoint runs/checkpoints/step_00000100 (held training 0.80s, written and verified "
       "in 34.1s beside it)\n"
       "checkpoint runs/checkpoints/step_00000200 (held training 0.70s, written and verified "
       "in 19.5s beside it)\n"
       "lost drafter 0 (node 0) at 12:00:00; resuming from step 100 (restart 1 of 2)\n"
       "resumed from runs/checkpoints/step_00000100 at step 100 (drafter rank 0: waited for "
       "the read-ahead 0.3s, copied from host memory 1.2s)\n"
       "actor set restarted 19.5s after the loss (drafters killed and data re-planned 0.2s, "
       "drafters built 9.1s, process group and rings 2.0s, checkpoint loaded 8.2s)\n"
       "[pipeline.driver.actors][INFO] - drafter rank 0 up 9.0s after it was asked for (before its "
       "constructor 4.5s, device ready 1.5s, target head read 1.0s, drafter built 2.0s, "
       "rest 0.0s)\n")


def test_figures_follow_from_the_rows():
    rows, kill, last = _rows()
    times = {"launch": 40.0, "exit": last + 10.0, "killed_at": kill, "gone_s": 1.5,
             "returncode": 0}
    out = _summarise(times, rows, LOG, samples_per_step=8, loss_rtol=1e-3)
    assert out["steps"] == 200
    assert out["start_to_first_step_s"] == rows[0]["time"] - 40.0
    assert out["checkpoint_stall_s"] == 0.8
    assert out["checkpoint_write_s"] == 34.1  # the slowest write, not the last
    assert abs(out["checkpoint_step_excess_s"] - 1.0) < 1e-9
    assert abs(out["kill_to_training_s"] - 20.4) < 1e-6
    assert out["killed_drafter_gone_s"] == 1.5
    assert out["after_restart_step_times_s"] == [0.5] * 20 and out["after_restart_excess_s"] == 0
    assert out["steady_samples_per_s"] == 16.0
    assert abs(out["e2e_efficiency"] - 0.5 * 200 / (last + 10.0 - 40.0)) < 1e-9
    assert abs(out["e2e_efficiency_after_start"]
               - 0.5 * 200 / (last + 10.0 - rows[0]["time"])) < 1e-9
    assert out["resumed_ok"] and out["repeated_steps"] == list(range(101, 111))
    assert out["resumed_from_step"] == 100
    assert out["evals"] == [100] and out["restarts"] == 1
    assert out["restart_parts_s"] == {"drafters killed and data re-planned": 0.2,
                                      "drafters built": 9.1, "process group and rings": 2.0,
                                      "checkpoint loaded": 8.2}
    assert out["drafter_starts_s"] == [{
        "up": 9.0, "before its constructor": 4.5, "device ready": 1.5, "target head read": 1.0,
        "drafter built": 2.0, "rest": 0.0}]
    assert out["checkpoint_loads_s"] == [{"waited for the read-ahead": 0.3,
                                          "copied from host memory": 1.2}]


def test_resumed_ok_is_false_when_the_repeated_losses_differ():
    rows, kill, last = _rows(repeat_loss_shift=0.01)
    times = {"launch": 40.0, "exit": last, "killed_at": kill, "returncode": 0}
    out = _summarise(times, rows, LOG, samples_per_step=8, loss_rtol=1e-3)
    assert not out["resumed_ok"] and out["repeated_loss_max_rel_diff"] > 1e-3


def test_resumed_ok_is_false_when_the_restart_found_no_checkpoint():
    """Losses repeated from step 0 match too, but nothing was resumed from a checkpoint."""
    rows, kill, last = _rows()
    times = {"launch": 40.0, "exit": last, "killed_at": kill, "returncode": 0}
    log = LOG.replace("resuming from step 100", "resuming from step 0 (no checkpoint yet)")
    out = _summarise(times, rows, log, samples_per_step=8, loss_rtol=1e-3)
    assert out["resumed_from_step"] == 0 and not out["resumed_ok"]


def test_the_kill_waits_for_a_durable_checkpoint(tmp_path):
    from bench.e2e_8b import _due

    metrics, log = tmp_path / "metrics.jsonl", tmp_path / "train.log"
    metrics.write_text('{"step": 130, "train/loss": 1.0}\n')
    log.write_text("step 130/200 loss 1.0\n")
    assert not _due(metrics, log, 130, wait_checkpoint=True)
    assert _due(metrics, log, 130, wait_checkpoint=False)
    log.write_text(LOG)
    assert _due(metrics, log, 130, wait_checkpoint=True)
    assert not _due(metrics, log, 131, wait_checkpoint=True)


def test_a_killed_process_is_gone_once_its_memory_is_freed():
    import signal
    import subprocess
    import sys

    from bench.e2e_8b import gone_after

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert gone_after(child.pid, limit_s=0.2) is None  # alive
        child.send_signal(signal.SIGKILL)
        seconds = gone_after(child.pid, limit_s=30.0)  # a zombie until waited for
        assert seconds is not None and 0 <= seconds < 30.0
    finally:
        child.kill()
        child.wait()
    assert gone_after(child.pid, limit_s=1.0) is not None  # reaped: no such process


def test_the_evaluator_runs_only_where_the_gpu_holds_it_beside_the_job(tmp_path):
    import argparse

    from bench.e2e_8b import _command, eval_on, relaunch_args

    assert eval_on("auto", 85.0) is False  # an H100's 80 GB (as torch counts it, 85e9 bytes)
    assert eval_on("auto", 150.1) is True  # an H200
    assert eval_on("on", 85.0) is True and eval_on("off", 150.1) is False
    args = argparse.Namespace(max_length=800, micro_batch=4, anchors=256, steps=200, every=100,
                              eval_prompts=8, set=[], eval="off")
    cmd = _command(args, tmp_path / "t", tmp_path / "d.jsonl", tmp_path / "run")
    assert "train.eval.every=-1" in cmd and "train.checkpoint.every=100" in cmd
    assert "train.eval.every=100" in _command(argparse.Namespace(**{**vars(args), "eval": "on"}),
                                              tmp_path / "t", tmp_path / "d.jsonl",
                                              tmp_path / "run")
    # The warm relaunch times its start only: no evaluation, whatever the first job had.
    on = argparse.Namespace(**{**vars(args), "eval": "on", "relaunch_steps": 3})
    short = _command(relaunch_args(on), tmp_path / "t", tmp_path / "d.jsonl", tmp_path / "warm")
    assert "train.eval.every=-1" in short and "train.plan.max_steps=3" in short


def test_the_steps_after_a_restart_are_listed_and_their_excess_summed():
    """The first step after the restart (its compile) is listed but counted neither as the
    restart's excess nor as the checkpoint's (it is step 101, right after the save at 100)."""
    rows, kill, last = _rows()
    after = [r for r in rows if r["time"] > kill]
    after[0]["perf/step_time_s"] = 9.0
    after[1]["perf/step_time_s"] = 0.9
    after[2]["perf/step_time_s"] = 0.8
    after[20]["perf/step_time_s"] = 5.0  # the twenty-first: outside the window
    times = {"launch": 40.0, "exit": last, "killed_at": kill, "returncode": 0}
    out = _summarise(times, rows, LOG, samples_per_step=8, loss_rtol=1e-3)
    assert out["after_restart_step_times_s"] == [9.0, 0.9, 0.8] + [0.5] * 17
    assert abs(out["after_restart_excess_s"] - 0.7) < 1e-9
    assert abs(out["checkpoint_step_excess_s"] - 1.0) < 1e-9  # the first pass's step 101
    # No kill, no restart: no figure, rather than an excess of 0.
    out = _summarise({**times, "killed_at": None}, rows, LOG, samples_per_step=8,
                     loss_rtol=1e-3)
    assert out["after_restart_step_times_s"] == [] and out["after_restart_excess_s"] is None
