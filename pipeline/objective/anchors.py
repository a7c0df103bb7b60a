"""Anchor sampling: where blocks start.

An anchor ``a`` is a position whose token and next token are both supervised. Each sample's
anchors depend only on (seed, epoch, sample id), never on which batch or rank the sample lands
in, so the Ray pipeline and the single-process trainer draw the same anchors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

_MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def sample_seed(seed: int, epoch: int, sample_id: int) -> int:
    """A 63-bit seed mixing the three integers (splitmix-style, stable across machines)."""
    x = (seed * _MIX[0] + epoch * _MIX[1] + sample_id * _MIX[2]) & (2**64 - 1)
    x ^= x >> 31
    x = (x * _MIX[1]) & (2**64 - 1)
    return (x ^ (x >> 29)) & (2**63 - 1)


def valid_anchor_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions a (1-D) with loss_mask[a] and loss_mask[a + 1] both set."""
    m = loss_mask.bool()
    return torch.nonzero(m[:-1] & m[1:]).flatten()


def sample_anchors_one(loss_mask: torch.Tensor, num_anchors: int,
                       generator: torch.Generator) -> torch.Tensor:
    """Up to ``num_anchors`` sorted valid positions, chosen uniformly without replacement."""
    valid = valid_anchor_positions(loss_mask.cpu())
    if valid.numel() > num_anchors:
        pick = torch.randperm(valid.numel(), generator=generator)[:num_anchors]
        valid = valid[pick]
    return torch.sort(valid).values


@dataclass
class Anchors:
    positions: torch.Tensor  # [N, A] int64, padded entries are 0
    keep: torch.Tensor       # [N, A] bool, False on padding
    # Packed rows (pipeline/objective/packing.py) hold several documents: each anchor's
    # document spans [starts, ends) of its row. None: the whole row is one document.
    starts: Optional[torch.Tensor] = None  # [N, A] int64
    ends: Optional[torch.Tensor] = None    # [N, A] int64

    @property
    def num_blocks(self) -> int:
        return self.positions.shape[1]

    def to(self, device) -> "Anchors":
        def move(t):
            return None if t is None else t.to(device)
        return Anchors(self.positions.to(device), self.keep.to(device), move(self.starts),
                       move(self.ends))


def sample_anchors(loss_mask: torch.Tensor, sample_ids: Sequence[int], num_anchors: int,
                   seed: int, epoch: int, pad_to: Optional[int] = None,
                   min_width: int = 1) -> Anchors:
    """Anchors for a batch; rows are padded to the longest (or to ``pad_to``), and to at least
    ``min_width``, with keep=False."""
    rows = []
    for row, sid in zip(loss_mask, sample_ids):
        g = torch.Generator().manual_seed(sample_seed(seed, epoch, int(sid)))
        rows.append(sample_anchors_one(row, num_anchors, g))
    width = pad_to if pad_to is not None else max(r.numel() for r in rows)
    width = max(width, min_width, 1)
    positions = torch.zeros(len(rows), width, dtype=torch.long)
    keep = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        positions[i, : r.numel()] = r
        keep[i, : r.numel()] = True
    return Anchors(positions.to(loss_mask.device), keep.to(loss_mask.device))
