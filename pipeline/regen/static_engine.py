"""Greedy decoding with continuous batching on a static KV cache (the ``static`` regen engine).

    from pipeline.regen.static_engine import StaticEngine, greedy_decode
    answers = greedy_decode(model, prompts, max_new_tokens=256, stops={2}, batch_size=512)
    engine = StaticEngine(model, batch_size=512)         # kept across calls (one per worker)
    answers = engine.decode(prompts, max_new_tokens=256, stops={2})

:class:`StaticEngine` keeps one :class:`~pipeline.regen.static_decoder.StaticDecoder` (the
cache and its captured graphs, pipeline/regen/static_decoder.py) from call to call, and builds
a larger one (one log line) only when a call needs more rows, columns or new tokens than it
has; it sizes it within the GPU's free memory, and decodes prompts longer than the main
decoder's columns on a second, narrower one.
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch

from pipeline.regen.cache_budget import (LONG_SHARE, MAIN_SHARE, columns_within, free_bytes,
                                         rows_within, slot_bytes)
from pipeline.regen.static_attention import (ATTENTIONS, ROW_LENGTHS, check_attention,
                                             stand_in, swapped)
from pipeline.regen.static_cache import check_supported
from pipeline.regen.static_decoder import StaticDecoder, aligned_columns

log = logging.getLogger(__name__)


def greedy_decode(model, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  stops: set[int] | Sequence[int], *, batch_size: int,
                  max_length: int | None = None, cuda_graphs: bool = True,
                  sync_every: int = 8, prefill_tokens: int = 16384,
                  span_bucket: int = 128, refill_rows: int | None = None,
                  attention: str = "sdpa", cache_gb: float | None = None,
                  compile_step: bool = False, compile_prefill: bool = False
                  ) -> list[list[int]]:
    """Each prompt's greedy answer (ids, cut after the first stop token), in prompt order, on
    a decoder built for this call alone (see :class:`StaticEngine` for the knobs)."""
    engine = StaticEngine(model, batch_size, cuda_graphs=cuda_graphs, sync_every=sync_every,
                          prefill_tokens=prefill_tokens, span_bucket=span_bucket,
                          refill_rows=refill_rows, attention=attention, cache_gb=cache_gb,
                          compile_step=compile_step, compile_prefill=compile_prefill)
    return engine.decode(prompts, max_new_tokens, stops, max_length=max_length)


class StaticEngine:
    """One model's static decoder, kept between calls.

    ``batch_size`` bounds the cache's rows; ``cuda_graphs`` captures the decode step where the
    model is on CUDA (on CPU the same step runs uncaptured); ``prefill_tokens`` bounds a prefill
    group's padded tokens; finished rows are refilled once ``refill_rows`` of them are free
    (default: 1/8 of the rows) or no more are waiting; attention spans are rounded up to
    ``span_bucket`` columns (one captured graph per span); ``attention`` is the decode step's
    attention (``static_attention.ATTENTIONS``). ``compile_step``: the decode step's forward
    through ``torch.compile`` (varlen or triton attention only, see
    :func:`~pipeline.regen.static_decoder.compiled_forward`); ``compile_prefill``: the
    prefills' forward through ``torch.compile`` with symbolic shapes (any attention, see
    :func:`~pipeline.regen.static_decoder.compiled_prefill`). Both apply to the kept decoder;
    prompts decoded apart (below) run uncompiled.
    ``timing``: wait for the device around prefills and captures, so ``last_stats`` splits
    setup from decoding (benches).
    ``cache_gb`` bounds the kept cache (default: ``cache_budget.MAIN_SHARE`` of the device
    memory free at the first call; unbounded on CPU): its columns are what ``batch_size`` rows
    hold within it, and a call's prompts too long for them are decoded apart, after the rest,
    on a decoder of as many rows as fit (one log line), uncompiled, and captured only where
    one graph serves every span (varlen, triton).
    """

    def __init__(self, model, batch_size: int, *, cuda_graphs: bool = True, sync_every: int = 8,
                 prefill_tokens: int = 16384, span_bucket: int = 128,
                 refill_rows: int | None = None, attention: str = "sdpa",
                 timing: bool = False, cache_gb: float | None = None,
                 compile_step: bool = False, compile_prefill: bool = False) -> None:
        check_supported(model)
        for key, value in (("batch_size", batch_size), ("sync_every", sync_every),
                           ("prefill_tokens", prefill_tokens), ("span_bucket", span_bucket)):
            if value < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
        if attention not in ATTENTIONS:
            raise ValueError(f"attention {attention!r}: allowed {', '.join(ATTENTIONS)}")
        if compile_step and attention not in ROW_LENGTHS:
            raise ValueError(f"compile_step needs attention {' or '.join(ROW_LENGTHS)} (one "
                             f"compiled shape serves every span), not {attention}")
        if cache_gb is not None and cache_gb <= 0:
            raise ValueError(f"cache_gb must be > 0, got {cache_gb}")
        self.model, self.batch_size = model, batch_size
        param = next(model.parameters())
        check_attention(attention, param.device, param.dtype)
        note = stand_in(attention, param.device, param.dtype)
        if note is not None:
            log.info("static decoder: %s", note)
        self.device, self.per_slot = param.device, slot_bytes(model.config, param.dtype)
        self.cache_budget = None if cache_gb is None else int(cache_gb * 1e9)
        self.cuda_graphs, self.sync_every = cuda_graphs, sync_every
        self.prefill_tokens, self.span_bucket = prefill_tokens, span_bucket
        self.refill_rows, self.attention, self.timing = refill_rows, attention, timing
        self.compile_step, self.compile_prefill = compile_step, compile_prefill
        self.decoder: StaticDecoder | None = None
        self.builds = 0
        self.apart = 0  # prompts decoded apart (too long for the kept cache), over all calls
        self.apart_longest = 0  # the longest of them, in tokens
        self.apart_columns = 0  # the kept cache's most columns a row when they went apart
        self.last_stats: dict = {}

    def decode(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
               stops: set[int] | Sequence[int], *, max_length: int | None = None
               ) -> list[list[int]]:
        """Each prompt's greedy answer, in prompt order. ``max_length`` (the cache's columns
        per row) must hold the longest prompt plus ``max_new_tokens - 1`` (the last token is
        never fed back); by default exactly that, grown as later calls need."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        prompts = [list(map(int, p)) for p in prompts]
        empty = [i for i, p in enumerate(prompts) if not p]
        if empty:
            raise ValueError(f"static decoder: prompt {empty[0]} is empty ({len(empty)} empty prompts)")
        if not prompts:
            return []
        need = max(len(p) for p in prompts) + max_new_tokens - 1
        if max_length is not None and max_length < need:
            raise ValueError(f"max_length {max_length} cannot hold the longest prompt "
                             f"({max(len(p) for p in prompts)} tokens) plus max_new_tokens "
                             f"{max_new_tokens} - 1 = {need}")
        stops = sorted({int(s) for s in stops})
        limit = None if max_length is not None else self._column_limit()
        needs = [len(p) + max_new_tokens - 1 for p in prompts]
        main = [i for i, n in enumerate(needs) if limit is None or n <= limit]
        long = [i for i, n in enumerate(needs) if limit is not None and n > limit]
        answers: list = [None] * len(prompts)
        self.last_stats = {}
        if main:
            decoder = self._fit(min(self.batch_size, len(main)),
                                max_length or max(needs[i] for i in main), max_new_tokens,
                                stops, limit)
            for i, answer in zip(main, self._run(decoder, [prompts[i] for i in main])):
                answers[i] = answer
            self.last_stats = dict(decoder.stats, builds=self.builds)
        if long:
            found = self._decode_long([prompts[i] for i in long], max_new_tokens, stops, limit)
            for i, answer in zip(long, found):
                answers[i] = answer
        return answers

    def _run(self, decoder: "StaticDecoder", prompts: list[list[int]]) -> list[list[int]]:
        refill = max(1, decoder.rows // 8) if self.refill_rows is None else self.refill_rows
        if not 1 <= refill <= decoder.rows:
            raise ValueError(f"refill_rows must be in [1, {decoder.rows}] (the rows in use), "
                             f"got {refill}")
        with torch.no_grad(), swapped(self.model, self.attention):
            return decoder.run(prompts, self.sync_every, refill)

    def _column_limit(self) -> int | None:
        """The kept cache's most columns at ``batch_size`` rows; None when unbounded."""
        if self.cache_budget is None:
            free = free_bytes(self.device)
            if free is None:
                return None
            self.cache_budget = int(MAIN_SHARE * free)
        return columns_within(self.cache_budget, self.batch_size, self.per_slot)

    def _decode_long(self, prompts: list[list[int]], max_new: int, stops: list[int],
                     limit: int) -> list[list[int]]:
        """Prompts too long for the kept cache, on a cache of their own, freed after."""
        longest = max(map(len, prompts))
        columns = aligned_columns(longest + max_new - 1)
        free = free_bytes(self.device)
        budget = None if free is None else int(LONG_SHARE * free)
        rows = rows_within(budget, columns, self.per_slot, min(self.batch_size, len(prompts)))
        if rows < 1:
            raise ValueError(f"static decoder: a prompt of {longest} "
                             f"tokens plus {max_new} new ones needs "
                             f"{columns * self.per_slot / 1e9:.2f} GB of KV cache for one row; "
                             f"{(budget or 0) / 1e9:.2f} GB are free")
        self.apart += len(prompts)
        self.apart_longest = max(self.apart_longest, longest)
        self.apart_columns = limit
        log.info("static decoder: %d of the call's prompts (up to %d tokens) do not fit the "
                 "kept cache's %d columns at %d rows: decoded apart, %d rows at a time",
                 len(prompts), longest, limit, self.batch_size, rows)
        # Captured where one graph serves every span: uncaptured, the 340 prompts of 8,192
        # that SmolLM2 at 4,096 rows left apart on an 80 GB H100 took 12.5 s of a 25.9 s
        # regeneration (2026-12-05), launch-bound at 49 ms a step.
        graphs = self.cuda_graphs and self.attention in ROW_LENGTHS
        decoder = StaticDecoder(self.model, rows, columns, max_new, stops, cuda_graphs=graphs,
                                prefill_tokens=self.prefill_tokens, span_bucket=self.span_bucket,
                                timing=self.timing, attention=self.attention)
        answers = self._run(decoder, prompts)
        self.last_stats["long"] = dict(decoder.stats, prompts=len(prompts), rows=rows)
        del decoder
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return answers

    def _fit(self, rows: int, length: int, max_new: int, stops: list[int],
             limit: int | None) -> "StaticDecoder":
        """The kept decoder when it has room for this call (stops and the new-token limit set
        in place), else a larger one built in its stead, of at most ``limit`` columns."""
        old = self.decoder
        if (old is not None and old.rows >= rows and old.capacity >= length
                and old.out.shape[1] > max_new and len(stops) <= old.stops.numel()):
            old.set_limits(max_new, stops)
            return old
        if old is not None:
            rows, length = max(rows, old.rows), max(length, old.max_length)
            max_new = max(max_new, old.out.shape[1] - 1)
            self.decoder = old = None  # its cache freed before the new one is allocated
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        # Columns rounded up to a span bucket: a later call with a slightly longer prompt
        # then fits, instead of costing a new cache and new captures.
        length = aligned_columns(length, self.span_bucket)
        if limit is not None:
            length = min(length, limit)
        self.decoder = StaticDecoder(self.model, rows, length, max_new, stops,
                                     cuda_graphs=self.cuda_graphs,
                                     prefill_tokens=self.prefill_tokens,
                                     span_bucket=self.span_bucket, timing=self.timing,
                                     attention=self.attention, compile_step=self.compile_step,
                                     compile_prefill=self.compile_prefill)
        self.builds += 1
        if self.builds > 1:
            log.info("static decoder: rebuilt for %d rows x %d columns, %d new tokens, %d stop "
                     "ids (build %d): its graphs are captured again", rows,
                     self.decoder.capacity, max_new, len(stops), self.builds)
        return self.decoder


