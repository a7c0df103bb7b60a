"""Summing gradients and the loss denominator over the drafter replicas in one collective."""

from __future__ import annotations

import torch
import torch.distributed as dist


class FlatReducer:
    """All-reduces a list of gradients plus one scalar through one preallocated flat buffer.

    One collective per step instead of one per parameter; the denominator rides in the last
    element, so every replica divides by the same global sum.
    """

    def __init__(self, numel: int, device: torch.device | str) -> None:
        self.flat = torch.zeros(numel + 1, dtype=torch.float32, device=device)

    def __call__(self, grads: list[torch.Tensor], denominator: float) -> float:
        offset = 0
        for g in grads:
            self.flat[offset:offset + g.numel()].copy_(g.reshape(-1))
            offset += g.numel()
        assert offset == self.flat.numel() - 1, "gradient sizes changed since the reducer was built"
        self.flat[-1] = denominator
        dist.all_reduce(self.flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in grads:
            g.copy_(self.flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        return float(self.flat[-1])
