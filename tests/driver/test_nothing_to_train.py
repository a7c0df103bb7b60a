"""A job with nothing to train ends at once: one 'nothing to train' line, exit code 0.

Rerunning a finished job's command resumes its newest checkpoint (train.checkpoint.resume=auto)
and must say so before Ray starts, whether the job was bounded by its epochs or by
train.plan.max_steps / stop_at_step; a plan that is empty for lack of samples says so too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.checkpoint.point import ResumePoint
from pipeline.driver.compose import compose_job
from pipeline.driver.finished import nothing_left
from pipeline.training.config import PlanConfig

ROOT = Path(__file__).resolve().parents[2]
CKPT = Path("run/checkpoints/step_00000004")


def test_nothing_left_reads_the_resume_point():
    done = ResumePoint(step=4, epoch=2, samples_done=0)  # both epochs finished
    assert "holds all train.plan.epochs=2 epochs (4 steps)" in nothing_left(
        PlanConfig(epochs=2), done, CKPT)
    assert nothing_left(PlanConfig(epochs=3), done, CKPT) is None  # a third epoch to go
    mid = ResumePoint(step=4, epoch=1, samples_done=6)
    assert nothing_left(PlanConfig(epochs=2), mid, CKPT) is None
    assert "holds 4 steps, and train.plan.max_steps=4" in nothing_left(
        PlanConfig(epochs=2, max_steps=4), mid, CKPT)
    assert "train.plan.stop_at_step=3" in nothing_left(
        PlanConfig(epochs=2, stop_at_step=3), mid, CKPT)
    assert nothing_left(PlanConfig(epochs=2, max_steps=5), mid, CKPT) is None


def _train(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_rerunning_a_finished_job_trains_nothing_and_exits_0(tiny_assets, tmp_path):
    data = tmp_path / "eight.jsonl"  # one drafter, 4 samples a step: 2 steps per epoch
    data.write_text("".join(open(tiny_assets.train_path).readlines()[:8]))
    out = tmp_path / "run"
    env = dict(os.environ, DFLASH_ASSETS_DIR=tiny_assets.root, RAY_ADDRESS="")
    cmd = [sys.executable, "-m", "pipeline.train", "cluster.drafters_per_node=1",
           "data.micro_batch_size=4", "train.plan.epochs=1", "train.eval.every=-1",
           f"data.train_path={data}", "train.checkpoint.resume=auto", f"train.out_dir={out}"]
    first = _train(cmd, env)
    text = first.stdout + first.stderr
    assert first.returncode == 0, text[-3000:]
    assert "done: 2 steps" in text and "tau not evaluated (train.eval.every=-1)" in text, \
        text[-3000:]

    # The same command again (max_steps bounds are decided alike: the unit test above).
    again = _train(cmd, env)
    text = again.stdout + again.stderr
    assert again.returncode == 0, text[-3000:]
    lines = [line for line in text.splitlines() if "nothing to train" in line]
    assert len(lines) == 1, text[-3000:]
    assert "holds all train.plan.epochs=1 epochs (2 steps)" in lines[0]
    assert "Traceback" not in text and "Started a local Ray" not in text, text[-3000:]


def test_a_max_length_that_drops_every_sample_is_refused_before_ray():
    """b680662 dropped every sample after Ray started and crashed at summary.losses[0]."""
    # The demo's blocks of 4 need 2 x 4 supervised tokens after a prompt: 7 tokens hold none.
    with pytest.raises(ValueError, match=r"data.max_length=7 .*drops every sample"):
        compose_job(["data.max_length=7"])
