"""Position-decayed weighted cross-entropy over the target's LM head, in chunks.

Returns the numerator sum(w * CE) and the denominator sum(w) separately, so that gradient
accumulation over micro-batches and ranks divides summed numerators by summed denominators
(exact, whatever the micro-batch sizes). Each chunk's logits are recomputed in backward
(activation checkpointing), so only one chunk of [rows, vocab] logits is alive at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint


@dataclass
class LossParts:
    numerator: torch.Tensor    # scalar, differentiable: sum(w * CE)
    denominator: torch.Tensor  # scalar: sum(w)
    correct: torch.Tensor      # [B] greedy-correct counts per block position
    total: torch.Tensor        # [B] scored counts per block position

    def detached(self) -> "LossParts":
        return LossParts(self.numerator.detach(), self.denominator, self.correct, self.total)


def _chunk_terms(hidden: torch.Tensor, lm_head: torch.Tensor, labels: torch.Tensor,
                 weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = (hidden @ lm_head.to(hidden.dtype).t()).float()
    ce = F.cross_entropy(logits, labels, reduction="none")
    correct = (logits.argmax(-1) == labels).to(torch.float32)
    return (ce * weights).sum(), correct


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
    numerator = hidden.new_zeros((), dtype=torch.float32)
    correct = torch.zeros(block_size, device=hidden.device)
    for start in range(0, rows.numel(), chunk_size):
        end = start + chunk_size
        args = (h[start:end], lm_head, y[start:end], w[start:end])
        if torch.is_grad_enabled() and hidden.requires_grad:
            part, hit = checkpoint(_chunk_terms, *args, use_reentrant=False)
        else:
            part, hit = _chunk_terms(*args)
        numerator = numerator + part
        correct.index_add_(0, pos[start:end], hit.detach())
    total = torch.zeros(block_size, device=hidden.device).index_add_(
        0, pos, torch.ones_like(w))
    return LossParts(numerator=numerator, denominator=w.sum().detach(),
                     correct=correct, total=total)
