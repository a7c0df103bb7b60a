"""Blocks, their positions, labels and loss weights.

A block is ``[anchor token, MASK x (B-1)]`` at absolute positions ``a .. a+B-1``. Block position
k >= 1 predicts token ``a + k`` with weight ``loss_mask(a+k) * keep * exp(-(k-1)/gamma)``, or
``loss_mask(a+k) * keep`` where no decay is asked for (D-PACE weights replace it: loss.py);
position 0 (the anchor itself) is never scored. The target's distribution for token ``a + k``
is the one it computes at position ``a + k - 1`` (distillation's teacher).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from pipeline.objective.anchors import Anchors


@dataclass
class Blocks:
    token_ids: torch.Tensor   # [N, A*B] anchor token then mask tokens
    positions: torch.Tensor   # [N, A*B] position ids a + k, counted from the document start
    labels: torch.Tensor      # [N, A*B] token a + k (0 where out of range)
    supervised: torch.Tensor  # [N, A*B] bool: scored (k >= 1, in range, loss_mask, keep)
    weights: torch.Tensor     # [N, A*B] float: decayed weight where supervised, else 0
    # [N, A*B] position a + k - 1 in the row: the target's prediction of the label is there
    teacher_positions: torch.Tensor


def position_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """[B] weights: 0 for the anchor, exp(-(k-1)/gamma) for k >= 1."""
    k = torch.arange(block_size, device=device, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


def build_blocks(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: Anchors,
                 block_size: int, mask_token_id: int, gamma: Optional[float]) -> Blocks:
    """``gamma`` None: every supervised position weighs 1 (no decay)."""
    n, seq_len = input_ids.shape
    offsets = torch.arange(block_size, device=input_ids.device)
    pos = anchors.positions[:, :, None] + offsets  # [N, A, B]
    # A block never reads past its document: in a packed row the next one starts there.
    end = seq_len if anchors.ends is None else anchors.ends[:, :, None]
    start = 0 if anchors.starts is None else anchors.starts[:, :, None]
    in_range = pos < end
    safe = pos.clamp(max=seq_len - 1)
    labels = torch.gather(input_ids, 1, safe.flatten(1)).view_as(pos)
    anchor_tok = torch.gather(input_ids, 1, anchors.positions)
    tokens = torch.full_like(pos, mask_token_id)
    tokens[:, :, 0] = anchor_tok
    label_mask = torch.gather(loss_mask, 1, safe.flatten(1)).view_as(pos).bool()
    supervised = in_range & label_mask & anchors.keep[:, :, None] & (offsets > 0)
    if gamma is None:
        weights = supervised.float()
    else:
        weights = position_weights(block_size, gamma, input_ids.device) * supervised
    # Clamped only to be a valid index everywhere: only supervised positions are read, and
    # theirs (a + k - 1, before the document's end) are in the row.
    teacher = (pos - 1).clamp(min=0, max=seq_len - 1)
    return Blocks(token_ids=tokens.flatten(1), positions=(pos - start).flatten(1),
                  labels=torch.where(in_range, labels, 0).flatten(1),
                  supervised=supervised.flatten(1), weights=weights.flatten(1),
                  teacher_positions=teacher.flatten(1))
