"""Position-weighted per-row losses over the target's LM head.

Returns the numerator sum(w * loss) and the denominator sum(w) separately, so that gradient
accumulation over micro-batches and ranks divides summed numerators by summed denominators
(exact, whatever the micro-batch sizes). Only supervised rows reach the head, in chunks, and
no logits outlive their chunk (:mod:`pipeline.objective.linear_ce`).

The weights w are the blocks' own (blocks.py), times the D-PACE weights (dpace.py) where
those are asked for. D-PACE weights come from the rows' cross-entropy, detached: they change
how much each row counts, never the direction of its gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from pipeline.objective.dpace import dpace_weights
from pipeline.objective.linear_ce import Distill, row_losses


@dataclass
class LossParts:
    numerator: torch.Tensor    # scalar, differentiable: sum(w * loss)
    denominator: torch.Tensor  # scalar: sum(w)
    correct: torch.Tensor      # [B] greedy-correct counts per block position
    total: torch.Tensor        # [B] scored counts per block position


@dataclass(frozen=True)
class Teacher:
    """The target's final normed hidden states and, per block position, which one it is
    scored against (the position that predicts its label)."""

    hidden: torch.Tensor     # [N, S, H]
    positions: torch.Tensor  # [N, Q] long, positions in 0..S-1
    distill: Distill


def chunked_loss(hidden: torch.Tensor, lm_head: torch.Tensor, labels: torch.Tensor,
                 weights: torch.Tensor, supervised: torch.Tensor, block_size: int,
                 chunk_size: int, dpace_alpha: Optional[float] = None,
                 teacher: Optional[Teacher] = None) -> LossParts:
    """hidden [N, Q, H]; labels/weights/supervised [N, Q]; Q is a multiple of block_size.

    ``dpace_alpha``: multiply ``weights`` by the D-PACE weights at that smoothing.
    ``teacher``: distil from the target's distribution (linear_ce.py) as well.
    """
    n, q = labels.shape
    k = torch.arange(q, device=hidden.device) % block_size
    rows = supervised.flatten().nonzero().flatten()
    h = hidden.flatten(0, 1).index_select(0, rows)
    y = labels.flatten().index_select(0, rows)
    w = weights.flatten().index_select(0, rows)
    w = w.to(torch.promote_types(w.dtype, torch.float32))
    pos = k.expand_as(labels).flatten().index_select(0, rows)
    soft = None
    if teacher is not None:
        s = teacher.hidden.shape[1]
        at = (torch.arange(n, device=hidden.device)[:, None] * s + teacher.positions)
        soft = teacher.hidden.flatten(0, 1).index_select(0, at.flatten().index_select(0, rows))
    parts = row_losses(h, lm_head, y, chunk_size, soft,
                       teacher.distill if teacher is not None else None)
    if dpace_alpha is not None:
        ce = parts.ce.new_zeros(n * q).index_copy_(0, rows, parts.ce)
        chain = dpace_weights(ce.view(n, q // block_size, block_size),
                              supervised.view(n, q // block_size, block_size), dpace_alpha)
        w = w * chain.flatten().index_select(0, rows)
    correct = torch.zeros(block_size, device=hidden.device).index_add_(
        0, pos, parts.hits.to(torch.float32))
    total = torch.zeros(block_size, device=hidden.device).index_add_(
        0, pos, torch.ones_like(y, dtype=torch.float32))
    return LossParts(numerator=(w * parts.loss).sum(), denominator=w.sum().detach(),
                     correct=correct, total=total)
