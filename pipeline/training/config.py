"""The training sections of the config: the optimizer and its schedule, and the step plan.

A drafter receives only :class:`OptimConfig` (and the seed); the prefetcher and the reference
trainer take :class:`PlanConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pipeline.checks.validate import require


@dataclass
class OptimConfig:
    """``train.optim``: AdamW, linear warmup then cosine decay, gradient clipping."""

    lr: float = 6e-4
    warmup_ratio: float = 0.04
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        require(self.lr > 0, "train.optim.lr", self.lr, "> 0")
        require(0 <= self.warmup_ratio < 1, "train.optim.warmup_ratio", self.warmup_ratio,
                "in [0, 1)")
        require(0 <= self.min_lr_ratio <= 1, "train.optim.min_lr_ratio", self.min_lr_ratio,
                "in [0, 1]")
        require(self.grad_clip >= 0, "train.optim.grad_clip", self.grad_clip,
                ">= 0 (0 disables)")


@dataclass
class PlanConfig:
    """``train.plan``: how many optimizer steps, and how many micro-batches each."""

    epochs: int = 1
    # Stop after this many optimizer steps (null: run all epochs).
    max_steps: Optional[int] = None
    # Stop (with a checkpoint) once this many steps are done, keeping the LR schedule of the
    # whole job: splits a job over several allocations; rerun the command to resume
    # (train.checkpoint.resume=auto, the default).
    stop_at_step: Optional[int] = None
    # Micro-batches each drafter backpropagates per optimizer step.
    grad_accum: int = 1

    def __post_init__(self) -> None:
        require(self.epochs >= 1, "train.plan.epochs", self.epochs, ">= 1")
        require(self.max_steps is None or self.max_steps >= 1, "train.plan.max_steps",
                self.max_steps, ">= 1 or null")
        require(self.stop_at_step is None or self.stop_at_step >= 1, "train.plan.stop_at_step",
                self.stop_at_step, ">= 1 or null")
        require(self.grad_accum >= 1, "train.plan.grad_accum", self.grad_accum, ">= 1")
