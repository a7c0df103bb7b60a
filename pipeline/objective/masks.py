"""The training attention mask, defined once and rendered for flex attention or SDPA.

Keys are ``[S context features | A*B block tokens]``; queries are the block tokens. A block
token sees context positions strictly before its anchor (the anchor's own target features do
not exist yet at inference), every token of its own block, and nothing of other blocks.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch.nn.attention.flex_attention import create_block_mask

from pipeline.model.drafter import AttentionMask


def make_mask_mod(anchors: torch.Tensor, context_len: int, block_size: int):
    """mask_mod(b, h, q, kv) -> bool; pure tensor ops so it also runs on broadcast grids."""

    def mask_mod(b, h, q_idx, kv_idx):
        block = q_idx // block_size
        anchor = anchors[b, block]
        is_context = kv_idx < context_len
        same_block = (kv_idx - context_len) // block_size == block
        return (is_context & (kv_idx < anchor)) | (~is_context & same_block)

    return mask_mod


def dense_mask(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """[N, 1, Q, S+Q] boolean mask for SDPA (True = may attend)."""
    n, num_blocks = anchors.shape
    q_len = num_blocks * block_size
    dev = anchors.device
    b = torch.arange(n, device=dev).view(n, 1, 1, 1)
    q = torch.arange(q_len, device=dev).view(1, 1, q_len, 1)
    kv = torch.arange(context_len + q_len, device=dev).view(1, 1, 1, -1)
    return make_mask_mod(anchors, context_len, block_size)(b, None, q, kv)


def flex_mask(anchors: torch.Tensor, context_len: int, block_size: int):
    n, num_blocks = anchors.shape
    q_len = num_blocks * block_size
    return create_block_mask(make_mask_mod(anchors, context_len, block_size), n, None,
                             q_len, context_len + q_len, device=anchors.device)


def build_mask(anchors: torch.Tensor, context_len: int, block_size: int,
               backend: Literal["sdpa", "flex"]) -> AttentionMask:
    if backend == "flex":
        return flex_mask(anchors, context_len, block_size)
    if backend == "sdpa":
        return dense_mask(anchors, context_len, block_size)
    raise ValueError(f"drafter.attention={backend!r} is not allowed: expected 'sdpa' or 'flex'")
