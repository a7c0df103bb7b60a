"""How many rows and columns of a static KV cache fit the memory a decoder may take.

A static cache holds ``rows x columns`` token slots per layer, sized for the longest prompt of
a call: one prompt of 6k tokens among thousands of 300 would multiply the cache by twenty at
the same rows. The engine therefore keeps its main cache within a budget and decodes the few
prompts that do not fit it apart, on a cache of fewer rows (:mod:`pipeline.regen.static_engine`).
"""

from __future__ import annotations

import torch

# Of the device memory free when the first cache is built, what the main cache may take: the
# rest holds the prefill's activations and, for a call's longest prompts, a second cache.
MAIN_SHARE = 0.6
LONG_SHARE = 0.8  # of the memory free once the main cache exists, for the long prompts' cache


def slot_bytes(config, dtype: torch.dtype) -> int:
    """Bytes of one row's one column over every layer (keys and values)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    size = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * size


def free_bytes(device: torch.device) -> int | None:
    """Device memory free now; None on CPU, where the cache is not bounded."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def columns_within(budget: int | None, rows: int, per_slot: int, multiple: int = 16) -> int | None:
    """The most columns (a multiple of ``multiple``) ``rows`` rows hold within ``budget`` bytes;
    None when unbounded."""
    if budget is None:
        return None
    return budget // (rows * per_slot) // multiple * multiple


def rows_within(budget: int | None, columns: int, per_slot: int, wanted: int) -> int:
    """The most rows (at most ``wanted``) of ``columns`` columns within ``budget`` bytes."""
    if budget is None:
        return wanted
    return min(wanted, budget // (columns * per_slot))
