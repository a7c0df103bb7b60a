import pytest
"""SIGTERM (`kill <driver pid>`, a scheduler's preemption) ends `python -m pipeline.train` as
Ctrl-C does: one line naming the newest checkpoint and the command that resumes, exit 143,
no checkpoint staging folder left, the run folder released, its local Ray gone, and none of
the C++ stack trace that Ray's core worker prints for a SIGTERM. The reference trainer
(`python -m pipeline.train_single`) stops the same way. (`ray job stop` against a real head:
tests/launch/test_job_submit.py.)"""

import os
import shlex
import signal
import subprocess
import sys

from pipeline.checkpoint import folders as ckpt
from pipeline.driver.runlock import LOCK_NAME
from tests.driver.cli_run import ROOT, group_gone, leftovers, wait_for


@pytest.mark.slow
def test_sigterm_after_a_checkpoint_says_how_to_resume(tiny_assets, small_train_file, tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, DFLASH_ASSETS_DIR=tiny_assets.root, RAY_ADDRESS="")
    # Many epochs: the job is still training (a checkpoint after every step, one being
    # written at almost any moment) when the signal comes.
    cmd = [sys.executable, "-m", "pipeline.train", "cluster.cpus_per_actor=0.5",
           "cluster.drafters_per_node=1", "train.eval.every=-1", "data.micro_batch_size=2",
           "train.plan.epochs=100",
           "train.checkpoint.every=1", "train.log_every=1000",
           f"data.train_path={small_train_file}", f"train.out_dir={out}"]
    job = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for(lambda: ckpt.latest(out) is not None, job, "a durable checkpoint")
        os.kill(job.pid, signal.SIGTERM)
        text, _ = job.communicate(timeout=300)
        assert not group_gone(job.pid), "Ray or actor processes outlived the driver"
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert job.returncode == 143, text[-3000:]
    assert "SIGTERM received" not in text and "logging.cc" not in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    lines = [line for line in text.splitlines() if "resume with: " in line]
    newest = ckpt.latest(out)
    assert len(lines) == 1 and "SIGTERM" in lines[0], text[-3000:]
    assert f"the newest checkpoint is {newest} (step {ckpt.read_point(newest).step})" \
        in lines[0], text[-3000:]
    # resume=auto is the config's default: the same command resumes.
    assert lines[0].endswith(f"resume with: {shlex.join(['python', *cmd[1:]])}"), lines[0]
    assert not (out / LOCK_NAME).exists()
    assert leftovers(out) == [], "a checkpoint staging folder was left behind"


@pytest.mark.slow
def test_sigterm_stops_the_reference_trainer_and_releases_its_folder(tiny_assets, tmp_path):
    out = tmp_path / "ref"
    env = dict(os.environ, DFLASH_ASSETS_DIR=tiny_assets.root)
    cmd = [sys.executable, "-m", "pipeline.train_single", "train.eval.prompts=1",
           "train.eval.max_new_tokens=4", "train.plan.epochs=100", f"train.out_dir={out}"]
    job = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        wait_for((out / "metrics.jsonl").exists, job, "its first step")
        job.send_signal(signal.SIGTERM)
        text, _ = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 143, text[-3000:]
    lines = [line for line in text.splitlines() if "stopped by SIGTERM" in line]
    assert len(lines) == 1 and "Traceback" not in text, text[-3000:]
    assert not (out / LOCK_NAME).exists()
