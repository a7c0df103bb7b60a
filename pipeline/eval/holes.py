"""The target's key/value cache for many rows decoded at once: shared columns, per-row holes.

transformers' caches append the same number of columns to every row of a batch. Rows of a
speculative batch accept different numbers of drafts each round, so every round's B-token
block is written into the SAME B new columns of every row, and what a row rejected stays there
as a hole: a column its later queries never attend to. Each column remembers, per row, whether
it holds accepted text (``valid``) and the token's true position (``pos``); the model gets
those positions for RoPE and a 4D additive mask built from them, so what a row sees is exactly
what decoding it alone would see. Rejected columns are dropped by :meth:`HoleCache.compact`
(a per-row gather of the valid columns), which also drops rows that are finished.

Sliding-window layers: the window is measured in positions (``q - k < window``, as
transformers' ``sliding_window_overlay`` measures it in a hole-free cache), never in columns;
the cache keeps every column of every layer (a plain ``DynamicCache()``, as the per-prompt
evaluator uses), and the window is applied in the mask. Models whose config lists sliding
layers take a dict of masks by layer type; the others take one tensor.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from pipeline.model.cache_keyword import cache_keyword

Masks = Union[torch.Tensor, dict[str, torch.Tensor]]


def _sliding(config) -> tuple[bool, Optional[int]]:
    """(whether the model takes masks by layer type, the window of its windowed layers)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or ()
    by_type = "sliding_attention" in types
    return by_type, (int(window) if window else None)


class HoleCache:
    """Keys/values of ``rows`` sequences in shared columns, with per-row validity and position.

    ``capacity`` None: a growing ``DynamicCache()``. Else a cache of that many columns
    allocated once (transformers' ``StaticLayer``s, every layer full width: a sliding layer's
    own ring would count columns, not positions), whose verify call has one fixed shape and
    can be captured as a CUDA graph; compaction then rewrites the columns in place.
    """

    def __init__(self, target: nn.Module, rows: int, device: torch.device,
                 capacity: Optional[int] = None) -> None:
        self.target = target
        self.cache_keyword = cache_keyword(target)
        self.capacity = capacity
        self.cache = _new_cache(target, capacity)
        self.by_type, self.window = _sliding(target.config)
        self.dtype = next(target.parameters()).dtype
        width = capacity or 0
        self.valid = torch.zeros(rows, width, dtype=torch.bool, device=device)
        self.pos = torch.zeros(rows, width, dtype=torch.long, device=device)
        self.used = 0
        self.forward = self._eager

    @property
    def columns(self) -> int:
        return self.used

    def masks(self, q_pos: torch.Tensor, q_valid: torch.Tensor) -> Masks:
        """Additive masks [R, 1, Q, K] for queries at ``q_pos`` [R, Q] written now at columns
        ``used..used+Q-1`` (K: the columns the cache hands attention: all, when static)."""
        q = q_pos.shape[1]
        if self.capacity is None:
            k_pos = torch.cat([self.pos, q_pos], dim=1)
            k_valid = torch.cat([self.valid, q_valid], dim=1)
        else:
            self.pos[:, self.used:self.used + q] = q_pos
            self.valid[:, self.used:self.used + q] = q_valid
            k_pos, k_valid = self.pos, self.valid
        causal = k_valid[:, None, :] & (k_pos[:, None, :] <= q_pos[:, :, None])
        # A query always sees its own column: a hole's query (padding, a finished row) then
        # attends to something, and never turns the softmax into NaN.
        own = torch.zeros_like(causal)
        steps = torch.arange(q, device=causal.device)
        own[:, steps, self.used + steps] = True
        full = self._additive(causal | own)
        if self.window is None:
            return {"full_attention": full, "sliding_attention": full} if self.by_type else full
        near = k_pos[:, None, :] > q_pos[:, :, None] - self.window
        sliding = self._additive((causal & near) | own)
        if self.by_type:
            return {"full_attention": full, "sliding_attention": sliding}
        return sliding

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        # Additive, not boolean: eager attention (gpt-oss with sinks) adds the mask to its
        # scores, SDPA takes either.
        out = torch.zeros(allowed.shape, dtype=self.dtype, device=allowed.device)
        out.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return out[:, None]

    def _eager(self, ids: torch.Tensor, q_pos: torch.Tensor, masks: Masks,
               logits_to_keep: int = 0):
        return self.target(ids, **{self.cache_keyword: self.cache}, use_cache=True,
                           output_hidden_states=True, position_ids=q_pos, attention_mask=masks,
                           logits_to_keep=logits_to_keep)

    def run(self, ids: torch.Tensor, q_pos: torch.Tensor, q_valid: torch.Tensor,
            logits_to_keep: int = 0):
        """The target on ``ids`` [R, Q] at positions ``q_pos``, appended as Q new columns."""
        assert self.capacity is None or self.used + ids.shape[1] <= self.capacity
        masks = self.masks(q_pos, q_valid)
        if logits_to_keep:  # the prefill: never the captured call
            out = self._eager(ids, q_pos, masks, logits_to_keep)
        else:
            out = self.forward(ids, q_pos, masks)
        if self.capacity is None:
            self.valid = torch.cat([self.valid, q_valid], dim=1)
            self.pos = torch.cat([self.pos, q_pos], dim=1)
        self.used += ids.shape[1]
        return out

    def set_valid(self, start: int, valid: torch.Tensor) -> None:
        """Mark columns ``start..start+valid.shape[1]-1`` (rejected drafts become holes)."""
        self.valid[:, start:start + valid.shape[1]] = valid

    def wasted(self) -> int:
        """Columns in use beyond the longest row's accepted text."""
        return self.used - int(self.valid.sum(1).max())

    def compact(self, keep_rows: Optional[torch.Tensor] = None) -> None:
        """Keep rows ``keep_rows`` (indices; all when None, the only choice when static), each
        with only its valid columns, left-aligned."""
        assert keep_rows is None or self.capacity is None
        valid = self.valid if keep_rows is None else self.valid[keep_rows]
        pos = self.pos if keep_rows is None else self.pos[keep_rows]
        counts = valid.sum(1)
        width = int(counts.max()) if counts.numel() else 0
        # A stable sort puts each row's valid columns first, in their order.
        order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices[:, :width]
        new_valid = torch.arange(width, device=valid.device)[None] < counts[:, None]
        new_pos = pos.gather(1, order)
        for layer in self.cache.layers:
            keys = _gather_columns(layer.keys, keep_rows, order)
            values = _gather_columns(layer.values, keep_rows, order)
            if self.capacity is None:
                layer.keys, layer.values = keys, values
            else:  # in place: a captured graph holds these addresses
                layer.keys[:, :, :width].copy_(keys)
                layer.values[:, :, :width].copy_(values)
                layer.cumulative_length.fill_(width)
        if self.capacity is None:
            self.valid, self.pos = new_valid, new_pos
        else:
            self.valid.zero_()
            self.valid[:, :width] = new_valid
            self.pos[:, :width] = new_pos
        self.used = width


def _new_cache(target: nn.Module, capacity: Optional[int]):
    from transformers import DynamicCache

    if capacity is None:
        return DynamicCache()
    from transformers.cache_utils import Cache, StaticLayer

    layers = target.config.get_text_config(decoder=True).num_hidden_layers
    return Cache(layers=[StaticLayer(max_cache_len=capacity) for _ in range(layers)])


def _gather_columns(x: torch.Tensor, rows: Optional[torch.Tensor], order: torch.Tensor) -> torch.Tensor:
    """x [R, heads, C, D] -> [len(rows), heads, W, D] with row i's columns ``order[i]``."""
    if rows is not None:
        x = x[rows]
    idx = order[:, None, :, None].expand(x.shape[0], x.shape[1], order.shape[1], x.shape[3])
    return x.gather(2, idx).contiguous()
