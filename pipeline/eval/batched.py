"""Greedy DFlash speculative decoding of many prompts at once: the same results, row by row,
as :func:`pipeline.eval.speculative.speculative_generate` on each prompt alone.

Each round, for every unfinished row at once: the drafter drafts B-1 tokens after the row's
anchor (its context features up to the anchor, masked per row to the row's own length, out of
one feature buffer allocated for the whole decode); the target verifies every row's block in
one forward over a cache with shared columns and per-row holes (:mod:`pipeline.eval.holes`);
each row accepts its own longest agreeing prefix. A finished row (eos or max_new_tokens) stops
counting and stops growing; its later columns are holes, and the next compaction drops it.

Families whose cache cannot be cut back to a prefix (a linear-attention layer's recurrent
state) have no fast path here: :func:`decode_many` decodes them prompt by prompt, and says so
once (pipeline/model/families.py decides).
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Protocol, Sequence

import torch
from torch import nn

from pipeline.eval.graphs import CapturedStep
from pipeline.eval.holes import HoleCache
from pipeline.eval.speculative import DecodeResult, DrafterProposer, speculative_generate
from pipeline.model.drafter import embed_tokens
from pipeline.model.families import batched_of, graph_verify_of

log = logging.getLogger(__name__)


def _taps(hidden_states: Sequence[torch.Tensor], tap_ids: Sequence[int]) -> torch.Tensor:
    return torch.cat([hidden_states[i + 1] for i in tap_ids], dim=-1)


class RowProposer(Protocol):
    block_size: int

    def propose_rows(self, tokens: torch.Tensor, anchors: torch.Tensor,
                     features: torch.Tensor) -> torch.Tensor:
        """Row r's text is ``tokens[r, :anchors[r]+1]``, ending with its anchor at position
        a = ``anchors[r]``; its context features are ``features[r, :a]`` (the rest of the
        buffer is room). Returns the drafts [R, B-1] for positions a+1 .. a+B-1."""


class RowDrafter:
    """A DFlash drafter drafting every row's block in one forward."""

    def __init__(self, proposer: DrafterProposer) -> None:
        self.proposer = proposer
        self.block_size = proposer.block_size
        self.step = self._draft  # replaced by a captured graph of it (batched_generate)

    def _draft(self, features: torch.Tensor, anchors: torch.Tensor,
               anchor_tokens: torch.Tensor) -> torch.Tensor:
        return draft_rows(self.proposer, features, anchors, anchor_tokens)

    def propose(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.proposer.propose(tokens, features)

    def propose_rows(self, tokens: torch.Tensor, anchors: torch.Tensor,
                     features: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        return self.step(features, anchors, tokens[rows, anchors])


@torch.no_grad()
def draft_rows(proposer: DrafterProposer, features: torch.Tensor, lengths: torch.Tensor,
               anchors: torch.Tensor) -> torch.Tensor:
    """B-1 drafted tokens [R, B-1] for every row: row r's context is ``features[r, :lengths[r]]``
    (positions 0..a-1), its anchor token ``anchors[r]`` sits at position ``lengths[r]``."""
    drafter, head, b = proposer.drafter, proposer.head, proposer.block_size
    rows, span = features.shape[:2]
    dev = features.device
    ids = torch.full((rows, b), proposer.mask_token_id, device=dev, dtype=torch.long)
    ids[:, 0] = anchors
    block_pos = lengths[:, None] + torch.arange(b, device=dev)[None]
    ctx_pos = torch.arange(span, device=dev)[None].expand(rows, span)
    # Each row attends to its own context only (the rest of the buffer is another length's
    # room), and to its whole block, as the one-prompt drafter does without a mask.
    seen = torch.cat([ctx_pos < lengths[:, None], torch.ones(rows, b, dtype=torch.bool,
                                                             device=dev)], dim=1)
    mask = seen[:, None, None, :].expand(rows, 1, b, span + b)
    embeds = embed_tokens(head.embed, ids, drafter.fc.weight.dtype, head.embed_scale)
    hidden = drafter(features, embeds, ctx_pos, block_pos, mask)
    return head.argmax(hidden[:, 1:])


class _Rows:
    """The decode state of R rows: tokens and features in buffers allocated once."""

    def __init__(self, prompts: Sequence[Sequence[int]], room: int, feature_size: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        rows = len(prompts)
        self.prompt_len = torch.tensor([len(p) for p in prompts], device=device)
        self.tokens = torch.zeros(rows, room, dtype=torch.long, device=device)
        for r, p in enumerate(prompts):
            self.tokens[r, :len(p)] = torch.tensor(list(p), device=device)
        self.length = self.prompt_len.clone()  # tokens so far, the anchor included
        self.features = torch.zeros(rows, room, feature_size, dtype=dtype, device=device)
        self.accepted: list[list[int]] = [[] for _ in range(rows)]
        self.done = torch.zeros(rows, dtype=torch.bool, device=device)


@torch.no_grad()
def batched_generate(target: nn.Module, proposer: RowProposer,
                     prompts: Sequence[Sequence[int]], tap_ids: Sequence[int],
                     max_new_tokens: int, eos_token_id: Optional[int] = None,
                     static: bool = False, graphs: bool = False,
                     pace: Callable[[], None] = lambda: None) -> list[DecodeResult]:
    """Greedy speculative decoding of all ``prompts`` at once (one batch); one result a prompt,
    equal to what :func:`speculative_generate` gives it alone (crop families only).

    ``static``: the cache and every step have fixed shapes (all rows stay to the end, finished
    ones as holes); ``graphs`` (CUDA, implies static): those steps replay captured CUDA graphs.
    """
    if not prompts:
        return []
    static = static or graphs
    dev = next(target.parameters()).device
    b = proposer.block_size
    longest = max(len(p) for p in prompts)
    room = longest + max_new_tokens + 2 * b
    # Static: room for a few rounds of holes past the longest possible row between compactions.
    capacity = room + 2 * b if static else None
    cache = HoleCache(target, len(prompts), dev, capacity)
    first = _prefill(cache, prompts, tap_ids, longest, dev)
    state = _Rows(prompts, room, first[1].shape[-1], first[1].dtype, dev)
    _take_prefill(state, first, longest)
    _finish(state, state.length - 1, max_new_tokens, eos_token_id)
    pace()  # the prefill of every prompt is one long burst: paced as a round is
    if graphs:
        _capture_steps(cache, proposer, state)
        pace()
    live = torch.arange(len(prompts), device=dev)  # rows of `state` the cache holds, in order
    try:
        while not bool(state.done[live].all()):
            live = _round(cache, proposer, state, live, tap_ids, b, max_new_tokens,
                          eos_token_id)
            pace()
    finally:
        if isinstance(proposer, RowDrafter):  # its graph read this batch's buffers
            proposer.step = proposer._draft
    return [_result(state, r, eos_token_id) for r in range(len(prompts))]


def _capture_steps(cache: HoleCache, proposer: RowProposer, state: "_Rows") -> None:
    """The verify call (where the family allows) and the drafter's block (when it is a DFlash
    drafter) as graphs."""
    def offsets():
        return [layer.cumulative_length.clone() for layer in cache.cache.layers]

    def put_back(saved):
        for layer, value in zip(cache.cache.layers, saved):
            layer.cumulative_length.copy_(value)
    if graph_verify_of(getattr(cache.target.config, "model_type", None)) is None:
        cache.forward = CapturedStep(cache.forward, "verify", offsets, put_back)
    if isinstance(proposer, RowDrafter):
        # The feature buffer is read where it lies (one address all decode), not copied in.
        captured = CapturedStep(lambda anchors, tokens: proposer._draft(state.features, anchors,
                                                                        tokens), "draft")

        def step(features, anchors, anchor_tokens):
            assert features is state.features
            return captured(anchors, anchor_tokens)
        proposer.step = step


def _prefill(cache: HoleCache, prompts, tap_ids, longest: int, dev):
    """All prompts right-aligned (left holes), so every row's last token is the last column."""
    rows = len(prompts)
    ids = torch.zeros(rows, longest, dtype=torch.long, device=dev)
    pos = torch.zeros(rows, longest, dtype=torch.long, device=dev)
    valid = torch.zeros(rows, longest, dtype=torch.bool, device=dev)
    for r, p in enumerate(prompts):
        ids[r, longest - len(p):] = torch.tensor(list(p), device=dev)
        pos[r, longest - len(p):] = torch.arange(len(p), device=dev)
        valid[r, longest - len(p):] = True
    out = cache.run(ids, pos, valid, logits_to_keep=1)
    return out.logits[:, -1].argmax(-1), _taps(out.hidden_states, tap_ids)


def _take_prefill(state: _Rows, first, longest: int) -> None:
    bonus, taps = first
    for r in range(state.tokens.shape[0]):
        n = int(state.prompt_len[r])
        state.features[r, :n] = taps[r, longest - n:]
    rows = torch.arange(state.tokens.shape[0], device=bonus.device)
    state.tokens[rows, state.length] = bonus
    state.length += 1


def _finish(state: _Rows, since: torch.Tensor, max_new_tokens: int,
            eos_token_id: Optional[int]) -> None:
    """Rows whose new text reached ``max_new_tokens`` or holds eos at or after ``since``."""
    done = state.length - state.prompt_len >= max_new_tokens
    if eos_token_id is not None:
        cols = torch.arange(state.tokens.shape[1], device=state.tokens.device)[None]
        fresh = (cols >= since[:, None]) & (cols < state.length[:, None])
        done |= ((state.tokens == eos_token_id) & fresh).any(1)
    state.done |= done


def _round(cache: HoleCache, proposer: RowProposer, state: _Rows, live: torch.Tensor,
           tap_ids, b: int, max_new_tokens: int, eos_token_id: Optional[int]) -> torch.Tensor:
    """One drafting and verifying round over the rows in ``live``; returns the new ``live``."""
    dev = live.device
    steps = torch.arange(b, device=dev)[None]
    anchor = state.length[live] - 1
    if cache.capacity is None:
        drafts = proposer.propose_rows(state.tokens[live], anchor,
                                       state.features[live, :int(anchor.max())])
    else:  # every row, the whole buffer: one shape every round
        drafts = proposer.propose_rows(state.tokens, anchor, state.features)
    block = torch.cat([state.tokens[live, anchor][:, None], drafts], dim=1)
    active = ~state.done[live]
    start = cache.columns
    out = cache.run(block, anchor[:, None] + steps, active[:, None].expand(-1, b))
    posterior = out.logits.argmax(-1)
    n = (drafts == posterior[:, :-1]).long().cumprod(1).sum(1)
    cache.set_valid(start, active[:, None] & (steps <= n[:, None]))
    # Write the whole block (features, tokens) at the row's own positions: what lies past the
    # accepted part is beyond the row's new length, never read, overwritten next round.
    rows = live[active]
    at = anchor[active][:, None] + steps
    taps = _taps(out.hidden_states, tap_ids)[active]
    state.features[rows[:, None], at] = taps.to(state.features.dtype)
    n_act = n[active]
    padded = torch.cat([drafts[active], drafts[active][:, :1]], dim=1)
    new = torch.where(steps < n_act[:, None], padded, posterior[active])
    state.tokens[rows[:, None], at + 1] = new
    for r, k in zip(rows.tolist(), n_act.tolist()):
        state.accepted[r].append(k)
    old = state.length.clone()
    state.length[rows] += n_act + 1
    _finish(state, old, max_new_tokens, eos_token_id)
    return _maybe_compact(cache, state, live, b)


def _maybe_compact(cache: HoleCache, state: _Rows, live: torch.Tensor, b: int) -> torch.Tensor:
    """Drop holes and finished rows once they are half the work (static: holes, once the
    next block would not fit)."""
    if cache.capacity is not None:
        if cache.used + b > cache.capacity:
            cache.compact()
        return live
    finished = int(state.done[live].sum())
    if finished == live.numel():
        return live
    if cache.wasted() < max(b, cache.columns // 2) and 2 * finished < live.numel():
        return live
    keep = (~state.done[live]).nonzero().flatten()
    cache.compact(keep)
    return live[keep]


def _result(state: _Rows, r: int, eos_token_id: Optional[int]) -> DecodeResult:
    new = state.tokens[r, int(state.prompt_len[r]):int(state.length[r])].tolist()
    if eos_token_id in new:
        new = new[: new.index(eos_token_id) + 1]
    return DecodeResult(tokens=new, accepted=state.accepted[r])


def decode_many(target: nn.Module, proposer: RowProposer, prompts: Sequence[Sequence[int]],
                tap_ids: Sequence[int], max_new_tokens: int, eos_token_id: Optional[int],
                batch_size: int, graphs: bool = False,
                pace: Callable[[], None] = lambda: None) -> list[DecodeResult]:
    """Every prompt's result, ``batch_size`` prompts at a time where the target's family has
    the fast path, else one at a time (said once, in one log line). ``pace`` is called after
    every round (batched) or prompt (one at a time)."""
    model_type = getattr(target.config, "model_type", None)
    why_not = batched_of(model_type)
    if why_not is not None or batch_size == 1:
        if why_not is not None:
            log.info("tau: decoding prompt by prompt (%s)", why_not)
        results = []
        for p in prompts:
            results.append(speculative_generate(target, proposer, p, tap_ids, max_new_tokens,
                                                eos_token_id))
            pace()
        return results
    no_graph = graph_verify_of(model_type)
    if graphs and no_graph is not None:
        log.info("tau: the verify step runs without a CUDA graph (%s)", no_graph)
    results: list[DecodeResult] = []
    for i in range(0, len(prompts), batch_size):
        results += batched_generate(target, proposer, prompts[i:i + batch_size], tap_ids,
                                    max_new_tokens, eos_token_id, graphs=graphs, pace=pace)
    return results
