"""Blocks, their positions, labels and loss weights.

A block is ``[anchor token, MASK x (B-1)]`` at absolute positions ``a .. a+B-1``. Block position
k >= 1 predicts token ``a + k`` with weight ``loss_mask(a+k) * keep * exp(-(k-1)/gamma)``;
position 0 (the anchor itself) is never scored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.objective.anchors import Anchors


@dataclass
class Blocks:
    token_ids: torch.Tensor   # [N, A*B] anchor token then mask tokens
    positions: torch.Tensor   # [N, A*B] position ids a + k, counted from the document start
    labels: torch.Tensor      # [N, A*B] token a + k (0 where out of range)
    supervised: torch.Tensor  # [N, A*B] bool: scored (k >= 1, in range, loss_mask, keep)
    weights: torch.Tensor     # [N, A*B] float: decayed weight where supervised, else 0


def position_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """[B] weights: 0 for the anchor, exp(-(k-1)/gamma) for k >= 1."""
    k = torch.arange(block_size, device=device, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


def build_blocks(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: Anchors,
                 block_size: int, mask_token_id: int, gamma: float) -> Blocks:
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
    weights = position_weights(block_size, gamma, input_ids.device) * supervised
    return Blocks(token_ids=tokens.flatten(1), positions=(pos - start).flatten(1),
                  labels=torch.where(in_range, labels, 0).flatten(1),
                  supervised=supervised.flatten(1), weights=weights.flatten(1))
