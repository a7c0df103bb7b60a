"""Prompts for regeneration: code/doc prefixes cut from a token stream, as chat JSONL.

Each line is ``{"messages": [user: the prefix, assistant: placeholder]}``; the placeholder is
what ``pipeline.regenerate`` replaces with the target's greedy answer.
"""

from __future__ import annotations

import json
import os

import torch

from pipeline.assets.chat_data import sample_prompts

PLACEHOLDER = "(to be regenerated)"


def write_prompts(path: str, tokenizer, stream: torch.Tensor, n: int,
                  lengths: tuple[int, int], seed: int) -> int:
    """Write ``n`` prompts drawn (seeded) from ``stream``; returns how many were written."""
    generator = torch.Generator().manual_seed(seed)
    prompts = sample_prompts(tokenizer, stream.long(), n, lengths, generator)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        for text in prompts:
            messages = [{"role": "user", "content": text},
                        {"role": "assistant", "content": PLACEHOLDER}]
            f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
    return len(prompts)
