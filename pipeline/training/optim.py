"""AdamW with linear warmup and cosine decay, and the exact accumulated update."""

from __future__ import annotations

import math
import sys

import torch
from torch import nn

from pipeline.training.config import OptimConfig


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas),
                             weight_decay=cfg.weight_decay)


def lr_factor(step: int, total_steps: int, warmup_ratio: float, min_lr_ratio: float) -> float:
    """Multiplier of the base lr at optimizer step ``step`` (0-based)."""
    warmup = max(1, round(total_steps * warmup_ratio)) if warmup_ratio > 0 else 0
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int,
                    cfg: OptimConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total_steps, cfg.warmup_ratio, cfg.min_lr_ratio))


def reapply_config(optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LambdaLR, cfg: OptimConfig) -> None:
    """After loading a checkpoint's optimizer and scheduler state, take lr, betas and
    weight_decay from ``cfg`` again: torch restores the saved ones, so a resume with a
    changed train.optim.lr would silently keep the old one. The LR becomes this schedule's
    value at the restored step (unchanged settings give back the saved LR exactly)."""
    scheduler.base_lrs = [cfg.lr for _ in optimizer.param_groups]
    for group, factor in zip(optimizer.param_groups, scheduler.lr_lambdas):
        group.update(initial_lr=cfg.lr, lr=cfg.lr * factor(scheduler.last_epoch),
                     betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def apply_update(model: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler, denominator: float,
                 grad_clip: float) -> tuple[float, bool]:
    """Gradients hold sum(numerator grads) of the whole step: divide, clip, step.

    Returns (gradient norm before clipping, skipped). A non-finite denominator or norm skips
    the update: weights and optimizer state stay as they were, and the schedule still advances
    so that the LR keeps following the step count. Given all-reduced gradients and
    denominator, every replica sees the same values and decides alike.
    """
    params = [p for p in model.parameters() if p.grad is not None]
    if denominator > 0:
        for p in params:
            p.grad.div_(denominator)
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm) if params else torch.zeros(())
    if _is_dtensor(norm):  # sharded gradients (drafter.parallel=fsdp): the global norm
        norm = norm.full_tensor()
    skipped = not (math.isfinite(denominator) and bool(torch.isfinite(norm)))
    if not skipped:
        optimizer.step()
    scheduler.step()
    # Zeroed in place, never dropped: the buffers must outlive CUDA-graph replays (see
    # DrafterTrainer).
    optimizer.zero_grad(set_to_none=False)
    return float(norm), skipped


def _is_dtensor(x: object) -> bool:
    """Whether ``x`` is a DTensor, without importing DTensor (most of a CPU-second, in every
    drafter actor): where torch.distributed.tensor was never imported, nothing is one."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(x, module.DTensor)
