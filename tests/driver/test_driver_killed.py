import pytest
"""The driver itself dies (SIGKILL mid-run): the same command, resubmitted, continues from the
newest complete checkpoint, and every sample is still trained exactly once."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.checkpoint import folders as ckpt

ROOT = Path(__file__).resolve().parents[2]


def _command(train_path, out):
    return [sys.executable, "-m", "pipeline.train", "cluster.cpus_per_actor=0.5",
            "cluster.drafters_per_node=1", "train.eval.every=-1", "data.micro_batch_size=4",
            "train.plan.epochs=2",
            "train.checkpoint.every=1", "train.checkpoint.resume=auto", "train.log_every=100",
            f"data.train_path={train_path}", f"train.out_dir={out}"]


def _wait_for(path, proc, timeout_s=300):
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"the driver exited early: {proc.returncode}"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_killed_driver_continues_when_the_command_is_resubmitted(tiny_assets, small_train_file,
                                                                   tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, DFLASH_ASSETS_DIR=tiny_assets.root, RAY_ADDRESS="")
    # 12 samples, 1 drafter x 4: 3 steps an epoch, 6 in all, a checkpoint after each (one
    # drafter: what is checked is the driver's death and the resubmitted command, not ranks).
    data = tmp_path / "twelve.jsonl"
    data.write_text("".join(small_train_file.read_text().splitlines(True)[:12]))
    cmd = _command(data, out)
    log = open(tmp_path / "first.log", "w")
    # Its own session: whatever Ray leaves behind after the driver dies is cleaned up by
    # group id below, and nothing else on the machine is touched.
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        _wait_for(ckpt.checkpoint_root(out) / "step_00000002", first)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        time.sleep(2)  # Ray's reaper stops the driver's local cluster; then clean the rest
        try:
            os.killpg(first.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()
    done = ckpt.latest(out)
    assert done is not None and 2 <= ckpt.read_point(done).step < 6

    second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600, start_new_session=True)
    text = second.stdout + second.stderr
    assert second.returncode == 0, text[-3000:]
    resumed = int(re.search(r"resumed from \S+ at step (\d+)", text).group(1))
    assert resumed >= ckpt.read_point(done).step
    assert ckpt.latest(out).name == "step_00000006"
    assert not [p for p in ckpt.checkpoint_root(out).iterdir() if p.name.startswith(".")]
    # Each epoch's accounting line: what the second run trained, nothing missing or repeated.
    lines = re.findall(r"epoch (\d): (\d+)/(\d+) planned samples trained, (\d+) missing, "
                       r"(\d+) repeated", text)
    assert lines and lines[-1][0] == "1"
    for _, trained, expected, missing, repeated in lines:
        assert trained == expected and missing == repeated == "0"
    assert f"done: {6 - resumed} steps" in text
