import pytest
"""One run folder, real `python -m pipeline.train` runs: a second job on the live folder is
refused at once naming the first; Ctrl-C ends the first with one line and the command that
resumes, also when it was started ignoring SIGINT (as a shell starts a background command);
that command, run as printed, takes over a dead job's lock and resumes."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

from pipeline.checkpoint import folders as ckpt
from pipeline.driver.runlock import LOCK_NAME

from tests.driver.cli_run import ROOT, group_gone, wait_for

# How long the job may take to end after its Ctrl-C: it waits stop_signals.GRACE_S at most for
# its actors, then kills them; Ray's shutdown and the last line come after.
STOP_S = 120


def _started_ignoring_sigint(cmd, **kwargs):
    """Popen with SIGINT ignored from the start, as a shell without job control starts
    `cmd &` (a script, a CI runner: the fresh-clone suite ran so, and its job trained on 300 s
    past its Ctrl-C). Python keeps an inherited ignore; the driver must not."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return subprocess.Popen(cmd, **kwargs)
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.slow
def test_a_live_folder_is_refused_and_ctrl_c_says_how_to_resume(tiny_assets, small_train_file,
                                                                 tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, DFLASH_ASSETS_DIR=tiny_assets.root, RAY_ADDRESS="",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    args = ["cluster.cpus_per_actor=0.5", "cluster.drafters_per_node=1",
            "train.eval.every=-1", "data.micro_batch_size=2",
            "train.plan.epochs=1000", "train.checkpoint.every=1", "train.log_every=1000",
            f"data.train_path={small_train_file}", f"train.out_dir={out}",
            "train.checkpoint.resume=null"]
    # 1,000 epochs are 12,000 steps: the job cannot end before its Ctrl-C, which comes once
    # its first checkpoint is durable (a checkpoint every step: one is being written at almost
    # any moment then). The job's end is waited for only STOP_S after it.
    cmd = [sys.executable, "-m", "pipeline.train", *args]
    first = _started_ignoring_sigint(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for((out / LOCK_NAME).exists, first, "the first job's lock")
        second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=300)
        text = second.stdout + second.stderr
        assert second.returncode == 2, text[-3000:]
        refusals = [line for line in text.splitlines() if "in use by another job" in line]
        assert len(refusals) == 1 and f"pid {first.pid} on host {socket.gethostname()}" \
            in refusals[0], text[-3000:]
        assert "Traceback" not in text and "Started a local Ray" not in text
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == first.pid

        wait_for(lambda: ckpt.latest(out) is not None, first, "a durable checkpoint")
        os.kill(first.pid, signal.SIGINT)
        try:
            stdout, stderr = first.communicate(timeout=STOP_S)
        except subprocess.TimeoutExpired as late:
            text = "".join(part.decode() if isinstance(part, bytes) else part or ""
                           for part in (late.stdout, late.stderr))
            raise AssertionError(f"the job did not end within {STOP_S} s of its Ctrl-C: "
                                 f"{text[-3000:]}") from None
        assert not group_gone(first.pid), "Ray or actor processes outlived the driver"
    finally:
        try:
            os.killpg(first.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    text = stdout + stderr
    assert first.returncode == 130, text[-3000:]
    assert "Traceback" not in text and not (out / LOCK_NAME).exists()
    lines = [line for line in text.splitlines() if "interrupted:" in line]
    assert len(lines) == 1, text[-3000:]
    newest = ckpt.latest(out)
    assert f"the newest checkpoint is {newest} " in lines[0]
    resume = lines[0].split("resume with: ", 1)[1]

    # A job that died holding the folder (killed, never released): its lock is stale.
    subprocess.run([sys.executable, "-c", "import sys; from pipeline.driver.runlock import "
                    "RunLock; RunLock(sys.argv[1]).acquire()", str(out)], cwd=ROOT, env=env,
                   check=True)
    dead = json.loads((out / LOCK_NAME).read_text())["pid"]
    step = ckpt.read_point(newest).step
    # As printed, shell and all; stop_at_step only keeps the rerun short.
    rerun = subprocess.run(["bash", "-c", f"{resume} train.plan.stop_at_step={step + 2}"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                           start_new_session=True)
    text = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, text[-3000:]
    assert re.search(rf"taking over \S+: its holder \(pid {dead} on host .*no longer running",
                     text), text[-3000:]
    assert f"resumed from {newest} at step {step}" in text and "done: 2 steps" in text
    assert not (out / LOCK_NAME).exists()
