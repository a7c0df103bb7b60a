"""The training attention mask, defined once and rendered for flex attention or SDPA.

Keys are ``[S context features | A*B block tokens]``; queries are the block tokens. A block
token sees context positions strictly before its anchor (the anchor's own target features do
not exist yet at inference), every token of its own block, and nothing of other blocks. In a
packed row (``starts`` given) it also sees nothing before its own document's first position.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

import torch
from torch.nn.attention.flex_attention import BlockMask

from pipeline.model.drafter import AttentionMask


def make_mask_mod(anchors: torch.Tensor, context_len: int, block_size: int,
                  starts: Optional[torch.Tensor] = None):
    """mask_mod(b, h, q, kv) -> bool; pure tensor ops so it also runs on broadcast grids."""
    if starts is None:
        starts = torch.zeros_like(anchors)

    def mask_mod(b, h, q_idx, kv_idx):
        block = q_idx // block_size
        anchor = anchors[b, block]
        is_context = kv_idx < context_len
        in_document = (kv_idx >= starts[b, block]) & (kv_idx < anchor)
        same_block = (kv_idx - context_len) // block_size == block
        return (is_context & in_document) | (~is_context & same_block)

    return mask_mod


def dense_mask(anchors: torch.Tensor, context_len: int, block_size: int,
               starts: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[N, 1, Q, S+Q] boolean mask for SDPA (True = may attend)."""
    n, num_blocks = anchors.shape
    q_len = num_blocks * block_size
    dev = anchors.device
    b = torch.arange(n, device=dev).view(n, 1, 1, 1)
    q = torch.arange(q_len, device=dev).view(1, 1, q_len, 1)
    kv = torch.arange(context_len + q_len, device=dev).view(1, 1, 1, -1)
    return make_mask_mod(anchors, context_len, block_size, starts)(b, None, q, kv)


# flex attention's tile edge: the BlockMask says, per (query tile, key tile), whether the
# tile is skipped, fully visible, or needs mask_mod evaluated element by element.
FLEX_TILE = 128


def _tile_extent(values: torch.Tensor, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row [N, L] -> min and max over consecutive tiles of ``tile`` columns."""
    n, length = values.shape
    pad = math.ceil(length / tile) * tile - length
    # Padding repeats the last column so it never widens a tile's range.
    padded = torch.cat([values, values[:, -1:].expand(n, pad)], dim=1).view(n, -1, tile)
    return padded.amin(-1), padded.amax(-1)


def flex_mask(anchors: torch.Tensor, context_len: int, block_size: int,
              tile: int = FLEX_TILE, starts: Optional[torch.Tensor] = None) -> BlockMask:
    """The BlockMask of :func:`make_mask_mod`, built from the anchors at tile granularity.

    ``create_block_mask`` evaluates mask_mod over the whole [Q, K] grid (GBs of int64
    intermediates at 4 x 3072 tokens and 512 anchors). The mask is fixed by the anchors, so
    the tile classes follow from intervals: a query tile whose anchors span [lo, hi] sees
    context tile [ks, ke) partly if ks < hi, fully if ke <= lo; its block tokens see only
    the key tiles under their own blocks, always partly (blocks are block-diagonal). With
    document ``starts`` spanning [s_lo, s_hi] in the query tile, a context tile is seen at
    all only if ke > s_lo, and fully only if also ks >= s_hi.
    """
    n, num_blocks = anchors.shape
    q_len = num_blocks * block_size
    kv_len = context_len + q_len
    q_tiles, kv_tiles = math.ceil(q_len / tile), math.ceil(kv_len / tile)
    dev = anchors.device
    per_query = anchors.repeat_interleave(block_size, dim=1)  # [N, Q]: each query's anchor
    lo, hi = _tile_extent(per_query, tile)  # [N, q_tiles]
    if starts is None:
        s_lo = s_hi = torch.zeros_like(lo)
    else:
        s_lo, s_hi = _tile_extent(starts.repeat_interleave(block_size, dim=1), tile)
    ks = torch.arange(kv_tiles, device=dev) * tile
    ke = (ks + tile).clamp(max=kv_len)
    ctx_any = ((ks < context_len)[None, None] & (ks[None, None] < hi[..., None])
               & (ke[None, None] > s_lo[..., None]))
    q_whole = (torch.arange(q_tiles, device=dev) + 1) * tile <= q_len
    ctx_full = ((ke <= context_len)[None, None] & (ke[None, None] <= lo[..., None])
                & (ks[None, None] >= s_hi[..., None]) & q_whole[None, :, None])
    # Key range of a query tile's own blocks: [S + first query, S + last query + 1),
    # widened to whole blocks (a block can straddle tiles when tile % block_size != 0).
    q0 = torch.arange(q_tiles, device=dev) * tile
    q1 = (q0 + tile).clamp(max=q_len)
    b0 = context_len + (q0 // block_size) * block_size
    b1 = context_len + ((q1 - 1) // block_size + 1) * block_size
    blk_any = (ks[None] < b1[:, None]) & (ke[None] > b0[:, None])  # [q_tiles, kv_tiles]
    full = ctx_full.expand(n, -1, -1)
    partial = (ctx_any | blk_any[None]) & ~full
    return BlockMask.from_kv_blocks(
        *_ordered(partial), *_ordered(full), BLOCK_SIZE=tile,
        mask_mod=make_mask_mod(anchors, context_len, block_size, starts),
        seq_lengths=(q_len, kv_len))


def _ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, q_tiles, kv_tiles] bool -> (counts [N, 1, q_tiles], indices [N, 1, q_tiles, kv])."""
    counts = tiles.sum(-1, dtype=torch.int32)
    indices = torch.argsort(tiles.to(torch.int8), dim=-1, descending=True, stable=True)
    return counts[:, None], indices[:, None].to(torch.int32)


def build_mask(anchors: torch.Tensor, context_len: int, block_size: int,
               backend: Literal["sdpa", "flex"],
               starts: Optional[torch.Tensor] = None) -> AttentionMask:
    if backend == "flex":
        return flex_mask(anchors, context_len, block_size, starts=starts)
    if backend == "sdpa":
        return dense_mask(anchors, context_len, block_size, starts)
    raise ValueError(f"drafter.attention={backend!r} is not allowed: expected 'sdpa' or 'flex'")
