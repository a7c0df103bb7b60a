"""The attention the static decoder runs the model with: SDPA over the row cache, GQA without
copying the cache.

With an explicit mask, transformers' own sdpa path repeats every key/value head for its query
group on CUDA (5.17 always; 5.24 except at one query token): at decode time that copies the
whole cache each layer, each step. Here a decode step folds each group's query heads into the
query-length axis instead (``[rows, kv_heads, group, head_dim]`` against the cache's
``[rows, kv_heads, span, head_dim]``; the ``[rows, 1, 1, span]`` mask broadcasts), and only a
prefill, whose keys are the prompt's own, repeats heads. Registered under one name in
transformers' attention registry and switched on for the decoder's calls only (``swapped``).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

NAME = "pipeline_static_rows"


def row_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """``query [b, heads, q, d]``, ``key/value [b, kv_heads, k, d]`` -> ``([b, q, heads, d], None)``."""
    b, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    if q_len == 1:
        out = F.scaled_dot_product_attention(query.reshape(b, kv_heads, group, dim), key, value,
                                             attn_mask=attention_mask, scale=scaling)
        out = out.reshape(b, heads, 1, dim)
    else:
        if group > 1:
            key = key.repeat_interleave(group, dim=1)
            value = value.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                             scale=scaling)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, row_attention)


@contextmanager
def swapped(model):
    """The model's attention set to :func:`row_attention` inside, restored after."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before
