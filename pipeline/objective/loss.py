"""Position-decayed weighted cross-entropy over the target's LM head.

Returns the numerator sum(w * CE) and the denominator sum(w) separately, so that gradient
accumulation over micro-batches and ranks divides summed numerators by summed denominators
(exact, whatever the micro-batch sizes). Only supervised rows reach the head, in chunks, and
no logits outlive their chunk (:mod:`pipeline.objective.linear_ce`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.objective.linear_ce import linear_cross_entropy


@dataclass
class LossParts:
    numerator: torch.Tensor    # scalar, differentiable: sum(w * CE)
    denominator: torch.Tensor  # scalar: sum(w)
    correct: torch.Tensor      # [B] greedy-correct counts per block position
    total: torch.Tensor        # [B] scored counts per block position


def chunked_loss(hidden: torch.Tensor, lm_head: torch.Tensor, labels: torch.Tensor,
                 weights: torch.Tensor, supervised: torch.Tensor, block_size: int,
                 chunk_size: int) -> LossParts:
    """hidden [N, Q, H]; labels/weights/supervised [N, Q]; Q is a multiple of block_size."""
    k = torch.arange(hidden.shape[1], device=hidden.device) % block_size
    rows = supervised.flatten().nonzero().flatten()
    h = hidden.flatten(0, 1).index_select(0, rows)
    y = labels.flatten().index_select(0, rows)
    w = weights.flatten().index_select(0, rows).float()
    pos = k.expand_as(labels).flatten().index_select(0, rows)
    numerator, hits = linear_cross_entropy(h, lm_head, y, w, chunk_size)
    correct = torch.zeros(block_size, device=hidden.device).index_add_(
        0, pos, hits.to(torch.float32))
    total = torch.zeros(block_size, device=hidden.device).index_add_(
        0, pos, torch.ones_like(w))
    return LossParts(numerator=numerator, denominator=w.sum().detach(),
                     correct=correct, total=total)
