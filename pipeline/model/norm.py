"""RMSNorm that returns its input's dtype.

HF's Qwen3RMSNorm multiplies an fp32 weight into the normalised activations, so under bf16
autocast with fp32 master weights every norm output (and all that follows it: q/k, the
context, the final hidden state and the head's logits) silently becomes fp32. Here the
statistics and the scale are computed in fp32 and the result is cast back, so a bf16 path
stays bf16; in fp32 it computes exactly what HF's norm does. Parameter names match HF's.
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight.float() * h).to(x.dtype)
