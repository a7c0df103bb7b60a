"""dtype names as config and flags spell them, and what "auto" means on each device."""

from __future__ import annotations

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """A dtype name, or "auto": bfloat16 on CUDA, float32 on CPU."""
    if name == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return DTYPES[name]
