"""A job with nothing to train ends at once: one 'nothing to train' line, exit code 0.

Rerunning a finished job's command resumes its newest checkpoint (train.checkpoint.resume=auto)
and must say so before Ray starts, whether the job was bounded by its epochs or by
train.plan.max_steps / stop_at_step; a plan that is empty for lack of samples says so too.
The rerun through the CLI is in test_contract.py, on that module's finished run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.checkpoint.point import ResumePoint
from pipeline.driver.compose import compose_job
from pipeline.driver.finished import nothing_left
from pipeline.training.config import PlanConfig

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


def test_a_max_length_that_drops_every_sample_is_refused_before_ray():
    """b680662 dropped every sample after Ray started and crashed at summary.losses[0]."""
    # The demo's blocks of 4 need 2 x 4 supervised tokens after a prompt: 7 tokens hold none.
    with pytest.raises(ValueError, match=r"data.max_length=7 .*drops every sample"):
        compose_job(["data.max_length=7"])
