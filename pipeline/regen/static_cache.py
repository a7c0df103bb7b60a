"""A static KV cache with one request per row, for driving a Hugging Face model's own forward.

The cache is allocated once: ``rows x kv_heads x max_length x head_dim`` per layer. Each row
holds one request at its own length, so a decode step writes every row's new key/value at that
row's own position (``positions``), and attention reads the row's prefix through an explicit 4D
mask built by the decoder (masking_utils returns a 4D mask as it is, in transformers 5.17 and
5.24 alike). A prefill writes a group of prompts, right-padded, into chosen rows from column 0;
the padded tail it leaves is masked until decode steps overwrite it.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

# Families whose attention is plain full attention over a standard KV cache (RoPE from
# position_ids, no logit soft-capping, no sliding window): what this cache serves.
SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def check_supported(model) -> None:
    """Refuse, with one line, a model this cache cannot serve exactly."""
    cfg = model.config
    family = getattr(cfg, "model_type", None)
    if family not in SUPPORTED_FAMILIES:
        raise ValueError(f"static decoder: model_type {family!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_FAMILIES)})")
    kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(cfg, "sliding_window", None) is not None:
        raise ValueError(f"static decoder: {family} with sliding-window layers "
                         f"(layer_types {sorted(kinds)}, sliding_window "
                         f"{getattr(cfg, 'sliding_window', None)}) is not supported")


class RowCache(Cache):
    """Per-layer K/V buffers of shape ``[rows, kv_heads, max_length, head_dim]``.

    Before each forward the decoder sets either ``prefill_rows`` with ``prefill_columns`` (a
    prefill of those rows, into columns ``arange(width)``) or ``positions`` with ``span`` (a
    decode step: one token per row, written at that row's position; attention then reads
    columns ``[0, span)`` of every row).
    """

    def __init__(self, config, rows: int, max_length: int, dtype: torch.dtype,
                 device: torch.device | str, token_major: bool = False):
        super().__init__(layers=[])
        kv_heads = config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # token_major: ``[rows, max_length, kv_heads, head_dim]``, rows of whole tokens, as the
        # varlen attention kernel reads a cache (static_attention's ``varlen``); a decode step
        # then gets the whole buffers back and reads each row's own length.
        self.token_major = token_major
        shape = ((rows, max_length, kv_heads, head_dim) if token_major
                 else (rows, kv_heads, max_length, head_dim))
        self.key_buffers = [torch.zeros(shape, dtype=dtype, device=device)
                            for _ in range(config.num_hidden_layers)]
        self.value_buffers = [torch.zeros(shape, dtype=dtype, device=device)
                              for _ in range(config.num_hidden_layers)]
        self.row_ids = torch.arange(rows, device=device)
        self.head_ids = torch.arange(kv_heads, device=device)
        self.max_length = max_length
        self.prefill_rows: torch.Tensor | None = None
        self.prefill_columns: torch.Tensor | None = None  # arange(width) of a prefill
        self.positions: torch.Tensor | None = None
        self.span = max_length

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = self.key_buffers[layer_idx], self.value_buffers[layer_idx]
        if self.prefill_rows is not None:
            # Rows and columns both as index tensors into the whole buffer, not a slice of it
            # (``keys[rows, :width] = ...``): torch.compile turns a write through a slice of an
            # input into a copy of that slice for every row of the cache and a copy back, each
            # layer (at the 8B shape, on an H100: 43% of a compiled prefill's GPU time outside its
            # matmuls, 11% of all; docs/BENCHMARKS.md, 2026-12-07).
            # (A ``:`` between index tensors is such a slice too, hence the heads' own index.)
            rows, cols = self.prefill_rows, self.prefill_columns
            if self.token_major:
                keys[rows[:, None], cols[None]] = key_states.transpose(1, 2)
                values[rows[:, None], cols[None]] = value_states.transpose(1, 2)
            else:
                at = (rows[:, None, None], self.head_ids[None, :, None], cols[None, None])
                keys[at] = key_states
                values[at] = value_states
            # The prompt attends to itself only: no need to read the buffers back.
            return key_states, value_states
        assert key_states.shape[2] == 1, "a decode step feeds one token per row"
        if self.token_major:
            keys[self.row_ids, self.positions] = key_states[:, :, 0]
            values[self.row_ids, self.positions] = value_states[:, :, 0]
            return keys, values
        keys[self.row_ids, :, self.positions] = key_states[:, :, 0]
        values[self.row_ids, :, self.positions] = value_states[:, :, 0]
        return keys[:, :, :self.span], values[:, :, :self.span]

    # The model never asks these when given position_ids and a 4D mask; answered for safety.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.max_length

    def __len__(self) -> int:
        return len(self.key_buffers)
