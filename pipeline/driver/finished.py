"""Whether a checkpoint already holds everything a job asks for: decided before Ray starts.

A rerun of a finished job's command resumes its newest checkpoint (train.checkpoint.resume=auto)
and must end at once with one line saying why, not start actors to find an empty plan. The
checkpoint's resume point says enough: its step against train.plan.max_steps and stop_at_step,
and its epoch against train.plan.epochs (the cursor of a finished epoch points at the next one,
sample 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pipeline.checkpoint.point import ResumePoint
from pipeline.training.config import PlanConfig


def nothing_left(plan: PlanConfig, point: ResumePoint, path: Path) -> Optional[str]:
    """Why resuming ``point`` (read from ``path``) trains nothing, or None when steps remain."""
    limits = [n for n in (plan.max_steps, plan.stop_at_step) if n is not None]
    if limits and point.step >= min(limits):
        return (f"checkpoint {path} holds {point.step} steps, and train.plan.max_steps="
                f"{plan.max_steps}, train.plan.stop_at_step={plan.stop_at_step}")
    if point.epoch >= plan.epochs:
        return (f"checkpoint {path} holds all train.plan.epochs={plan.epochs} epochs "
                f"({point.step} steps); raise train.plan.epochs to train more")
    return None
