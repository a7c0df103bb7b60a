"""Packing a micro-batch's rows into one drafter sequence with one pool of anchor blocks.

The target runs a bucket's rows as they are ([R, L], each row one sample). The drafter's work
grows with its anchor blocks, and a row padded to ``min(num_anchors, L)`` blocks wastes the
blocks its sample does not have: a 200-token sample has about 200 anchors, but its row of a
512-token bucket carries 512. Packed, the rows' features become one sequence of ``tokens``
positions and their anchors one pool of ``anchors`` blocks, filled in row order: every real
anchor keeps its sample's draw, and only the pool's tail is padding. The planner fills each
micro-batch up to the pool (pipeline/data/batching.py), so the drafter runs a single shape
whatever the bucket.

Each anchor carries its document's span [start, end) in the packed sequence: the mask keeps
its block from seeing another document's context (masks.py), its labels stop at the document
end (blocks.py), and its position ids count from the document start, as unpacked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from pipeline.objective.anchors import Anchors


@dataclass(frozen=True)
class Packing:
    tokens: int   # context positions of the packed sequence (data.tokens_per_micro_batch)
    anchors: int  # anchor blocks of its pool (data.anchors_per_micro_batch)


def pack_anchors(anchors: Anchors, row_len: int, pool: int) -> Anchors:
    """[R, W] per-row anchors (positions within each row) -> [1, pool] in the packed sequence."""
    rows = torch.arange(anchors.positions.shape[0])[:, None].expand_as(anchors.positions)
    start = rows * row_len
    keep = anchors.keep
    count = int(keep.sum())
    if count > pool:
        raise ValueError(f"a micro-batch of {anchors.positions.shape[0]} samples has {count} "
                         f"anchors, more than the pool of {pool} (data.anchors_per_micro_batch):"
                         f" the plan was made with another drafter.num_anchors or pool")
    out = torch.zeros(3, 1, pool, dtype=torch.long)
    for i, t in enumerate((anchors.positions + start, start, start + row_len)):
        out[i, 0, :count] = t[keep]  # row-major: sorted within each row, rows in order
        # The pool's padding repeats the last anchor: its blocks then add no key tiles to
        # the BlockMask (a padding anchor at 0 would widen its query tile to every document).
        out[i, 0, count:] = out[i, 0, count - 1] if count else 0
    kept = torch.arange(pool)[None] < count
    return Anchors(out[0], kept, starts=out[1], ends=out[2])


def pack_rows(features: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
              tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """[R, L, ...] rows -> ([1, tokens, ...] features, ids, loss mask, per-row position ids).

    Positions past R * L are zero padding that no anchor's document covers.
    """
    r, length = input_ids.shape
    if r * length > tokens:
        raise ValueError(f"{r} rows of {length} tokens do not fit a packed sequence of "
                         f"{tokens} (data.tokens_per_micro_batch)")
    pad = tokens - r * length

    def flat(x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(1, r * length, *x.shape[2:])
        return F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad)) if pad else x

    positions = (torch.arange(tokens, device=input_ids.device) % length)[None]
    return flat(features), flat(input_ids), flat(loss_mask), positions
