"""The static-cache decoder: a KV cache allocated once, one request per row, and a decode step
that runs every row at its own position (captured as CUDA graphs on CUDA).

:class:`StaticDecoder` holds the cache (pipeline/regen/static_cache.py), the per-row state on
device and the step; pipeline/regen/static_engine.py sizes it, keeps it from call to call and
feeds it prompts. Shape (as gpt-fast and vLLM): each decode step writes K/V at every row's own
position (RoPE position ids, a mask over that row's prefix); on CUDA the step is captured as a
CUDA graph, one per attention span bucket, with the argmax and the bookkeeping (tokens out,
counts, stop check) inside, so ``sync_every`` steps replay without a host sync. Attention runs
through ``static_attention`` (grouped query heads against the cache, no copy of it). At each
sync finished rows (a stop token, or ``max_new_tokens``) are collected and refilled with
waiting prompts, prefilled together and written into the freed rows: the batch stays full.
Stop tokens and ``max_new_tokens`` are device tensors the graphs read, so changing them
recaptures nothing.

Each answer holds the generated ids up to and including the first stop token, as a row of
``model.generate`` does before its padding; ``pipeline.regen.greedy.cut_at_stop`` cuts it the same.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Sequence

import torch

from pipeline.model.cache_keyword import cache_keyword
from pipeline.regen.static_attention import ROW_LENGTHS, decode_block_mask
from pipeline.regen.static_cache import RowCache

log = logging.getLogger(__name__)

STOP_SLOTS = 8  # stop ids the step compares against (padded with -1); more rebuild the decoder
# torch.compile's backend for compile_step; CPU tests trace with "aot_eager" (the same graph
# capture and functionalisation of the cache writes, without inductor's minute of C++ builds).
COMPILE_BACKEND = "inductor"


def aligned_columns(columns: int, multiple: int = 16) -> int:
    """``columns`` rounded up to a multiple of ``multiple`` (the cache's width)."""
    return -(-columns // multiple) * multiple


def prefill_group_end(prompts: Sequence[Sequence[int]], start: int, budget: int
                      ) -> tuple[int, int]:
    """``(end, width)``: ``prompts[start:end]`` is the longest run from ``start`` (one prompt at
    least) whose padded size, its count times its longest prompt ``width``, fits ``budget``."""
    width, end = len(prompts[start]), start
    while end < len(prompts):
        wider = max(width, len(prompts[end]))
        if end > start and wider * (end - start + 1) > budget:
            break
        width, end = wider, end + 1
    return end, width


def compiled_forward(body):
    """``body``'s forward through ``torch.compile``, for the decode step only.

    Uncompiled, a step at the 8B shape spends a quarter of its GPU time in some 20 small
    kernels a layer (RMSNorm's power, mean, rsqrt and products, RoPE's halves, SiLU times up,
    residual adds, casts; profile in docs/bench/h200_decode_2026-12-04d/); compiled, each run
    of them is one fused kernel. ``dynamic=False``: the step has one shape per decoder, and with
    varlen attention one for every span; ``fullgraph``: a graph break would leave the step in
    pieces run eagerly between compiled ones, which must not pass unnoticed. The compiled code
    is then captured in the decoder's own CUDA graph like the uncompiled step."""
    return torch.compile(body, backend=COMPILE_BACKEND, dynamic=False, fullgraph=True)


def compiled_prefill(body):
    """``body``'s forward through ``torch.compile`` for the prefills (``compile_prefill``).

    At the 8B shape the prefill of the refills takes 11.6 s of a 27-30 s regeneration
    (docs/BENCHMARKS.md, 2026-12-04 day 4), its matmuls some two thirds of that: the rest is
    the same small kernels a layer as the step's, over a group's every token. A group's rows
    and columns change from call to call, so the shapes are symbolic (``dynamic=True``): one
    compile serves every group, with at most one more where dynamo specialises a size of 1
    (a group of one prompt). Not captured: a prefill's work dwarfs its launches."""
    return torch.compile(body, backend=COMPILE_BACKEND, dynamic=True, fullgraph=True)


class StaticDecoder:
    """The cache, the per-row state on device, and the decode step (captured or not)."""

    def __init__(self, model, rows: int, max_length: int, max_new_tokens: int, stops,
                 *, cuda_graphs: bool, prefill_tokens: int, span_bucket: int,
                 timing: bool = False, attention: str = "sdpa", compile_step: bool = False,
                 compile_prefill: bool = False):
        self.model, self.body, self.head = model, model.base_model, model.get_output_embeddings()
        self.step_forward = compiled_forward(self.body) if compile_step else self.body
        self.prefill_forward = compiled_prefill(self.body) if compile_prefill else self.body
        self.cache_kw = cache_keyword(self.body)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.rows, self.max_length = rows, max_length
        self.prefill_tokens, self.span_bucket, self.timing = prefill_tokens, span_bucket, timing
        # The decode step's mask follows its attention (static_attention): an additive tensor
        # (sdpa, matmul), a flex block mask (flex), or each row's filled length (varlen and
        # triton, whose cache is token-major for their kernels).
        self.attention = attention
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        if cuda_graphs and not self.use_graphs:
            log.info("static decoder: model on %s, decode step runs uncaptured", self.device)
        # Columns in multiples of 16: SDPA's memory-efficient kernel wants the mask's last
        # dimension aligned, and would otherwise copy it (or fall back to the math kernel).
        self.capacity = aligned_columns(max_length)
        self.cache = RowCache(model.config, rows, self.capacity, self.dtype, self.device,
                              token_major=attention in ROW_LENGTHS)
        dev = self.device
        # Per-row state, updated in place by the step so that a captured graph sees it.
        self.ids = torch.zeros(rows, dtype=torch.long, device=dev)       # token fed next
        self.pos = torch.zeros(rows, dtype=torch.long, device=dev)       # its position
        self.n_gen = torch.zeros(rows, dtype=torch.long, device=dev)     # tokens generated
        self.done = torch.ones(rows, dtype=torch.bool, device=dev)       # finished or empty
        self.out = torch.zeros(rows, max_new_tokens + 1, dtype=torch.long, device=dev)
        # The call's limits, read by the captured step from these buffers.
        self.stops = torch.full((max(STOP_SLOTS, len(stops)),), -1, dtype=torch.long, device=dev)
        self.limit = torch.zeros((), dtype=torch.long, device=dev)
        self.set_limits(max_new_tokens, stops)
        self.columns = torch.arange(self.capacity, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.stats: dict = {}

    def set_limits(self, max_new_tokens: int, stops: Sequence[int]) -> None:
        """This call's ``max_new_tokens`` and stop ids (-1 pads: no token ever matches)."""
        assert max_new_tokens < self.out.shape[1] and len(stops) <= self.stops.numel()
        self.max_new = max_new_tokens
        self.limit.fill_(max_new_tokens)
        self.stops.copy_(torch.tensor(list(stops) + [-1] * (self.stops.numel() - len(stops))))

    # ---- the loop --------------------------------------------------------------------------

    def run(self, prompts: list[list[int]], sync_every: int, refill_rows: int) -> list[list[int]]:
        # Longest first: refill groups have similar lengths (little padding), and the tail,
        # when the batch empties, is made of the cheapest requests.
        waiting = deque(sorted(range(len(prompts)), key=lambda i: -len(prompts[i])))
        owner: list[int | None] = [None] * self.rows   # which prompt each row holds
        # Each owned row's position, known on the host: a live row moves one column a step,
        # and rows are collected (freed) at every sync, so the next span needs no transfer.
        self.host_pos = [0] * self.rows
        answers: list[list[int] | None] = [None] * len(prompts)
        self.stats = {"prefill_s": 0.0, "prefill_calls": 0, "capture_s": 0.0, "captures": 0,
                      "steps": 0, "syncs": 0}
        start = time.perf_counter()
        # Refill once a few rows are free, not at every sync: an idle row costs a step almost
        # nothing, while each prefill call has a fixed cost (it is not captured).
        while True:
            self._collect(owner, answers)
            free = [r for r in range(self.rows) if owner[r] is None]
            if waiting and len(free) >= min(refill_rows, len(waiting)):
                take = [waiting.popleft() for _ in range(min(len(free), len(waiting)))]
                self._prefill(free[:len(take)], [prompts[i] for i in take])
                for r, i in zip(free, take):
                    owner[r] = i
                    self.host_pos[r] = len(prompts[i])
                continue  # a prompt may finish at its first token: collect again
            if all(o is None for o in owner):
                break
            span = self._span(owner, sync_every)
            for _ in range(sync_every):
                self._step_once(span)
            for r in range(self.rows):
                self.host_pos[r] += sync_every
            self.stats["steps"] += sync_every
        self.stats["wall_s"] = time.perf_counter() - start
        self.stats["graphs"] = len(self.graphs)
        log.info("static decoder: %d prompts, %d decode steps of %d rows, %d span graphs",
                 len(prompts), self.stats["steps"], self.rows, len(self.graphs))
        assert all(a is not None for a in answers)
        return answers  # type: ignore[return-value]

    def _collect(self, owner: list[int | None], answers: list) -> None:
        """Answers of finished rows copied out, their rows freed: one transfer to learn which
        rows finished, one for their tokens and counts."""
        done = self.done.tolist()
        self.stats["syncs"] += 1
        rows = [r for r in range(self.rows) if done[r] and owner[r] is not None]
        if not rows:
            return
        index = torch.tensor(rows, device=self.device)
        found = torch.cat([self.n_gen[index, None], self.out[index]], dim=1).tolist()
        for r, (n, *row_tokens) in zip(rows, found):
            answers[owner[r]] = row_tokens[:n]
            owner[r] = None

    def _span(self, owner: list[int | None], steps: int) -> int:
        """Columns the next ``steps`` decode steps attend to, rounded up to a bucket: the
        furthest live row's position plus ``steps`` (every owned row is live after a collect)."""
        if self.attention in ROW_LENGTHS:  # each row reads its own length: one graph serves all
            return self.capacity
        top = max(p for p, o in zip(self.host_pos, owner) if o is not None) + steps + 1
        span = -(-top // self.span_bucket) * self.span_bucket
        return min(span, self.capacity)

    def _timed(self, key: str, fn) -> None:
        """``fn()``, its seconds added to ``stats[key]`` (the device waited for if ``timing``)."""
        if self.timing and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        fn()
        if self.timing and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.stats[key] = self.stats.get(key, 0.0) + time.perf_counter() - t0

    # ---- prefill ---------------------------------------------------------------------------

    def _prefill(self, rows: list[int], prompts: list[list[int]]) -> None:
        """Prefill ``prompts`` into ``rows`` in groups of at most ``prefill_tokens`` padded tokens."""
        start = 0
        while start < len(prompts):
            end, width = prefill_group_end(prompts, start, self.prefill_tokens)
            group = (rows[start:end], prompts[start:end], width)
            self._timed("prefill_s", lambda: self._prefill_group(*group))
            self.stats["prefill_calls"] = self.stats.get("prefill_calls", 0) + 1
            start = end

    def _prefill_group(self, rows: list[int], prompts: list[list[int]], width: int) -> None:
        # Widths rounded up to 16 columns. Unrounded widths padded less (3.1% of the prompt
        # tokens against 5.6%) but ran slower on an
        # H100 with the prefill compiled (8B shape, 2026-12-07; docs/BENCHMARKS.md): the timed
        # prefills 8.73 -> 9.23 s, and the first wave's, which compile, 111 -> 160 s.
        dev, n, width = self.device, len(prompts), min(aligned_columns(width), self.capacity)
        ids = torch.zeros(n, width, dtype=torch.long)
        for j, p in enumerate(prompts):
            ids[j, :len(p)] = torch.tensor(p)
        lengths = torch.tensor([len(p) for p in prompts], device=dev)
        ids = ids.to(dev)
        cols = torch.arange(width, device=dev)
        row_index = torch.tensor(rows, device=dev)
        self.cache.prefill_rows, self.cache.prefill_columns = row_index, cols
        try:
            # Right padding: attention is causal within the group (static_attention._prefill).
            hidden = self.prefill_forward(input_ids=ids, position_ids=cols[None].expand(n, width),
                               attention_mask=lengths.to(torch.int32).view(n, 1, 1, 1),
                               use_cache=True, **{self.cache_kw: self.cache}).last_hidden_state
        finally:
            self.cache.prefill_rows = self.cache.prefill_columns = None
        first = self.head(hidden[torch.arange(n, device=dev), lengths - 1]).argmax(-1)
        self.ids[row_index] = first
        self.pos[row_index] = lengths
        self.n_gen[row_index] = 1
        self.out[row_index, 0] = first
        self.done[row_index] = self._is_stop(first) | (self.max_new <= 1)

    # ---- decode ----------------------------------------------------------------------------

    def _additive(self, visible: torch.Tensor) -> torch.Tensor:
        """A boolean visibility mask as the additive float mask both sdpa and eager take."""
        blocked = torch.finfo(self.dtype).min
        return torch.zeros(visible.shape, dtype=self.dtype, device=self.device).masked_fill(~visible, blocked)

    def _is_stop(self, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens[:, None] == self.stops[None]).any(-1)

    def _step(self, span: int) -> None:
        """One token for every row, all on device; finished rows step too but change nothing."""
        self.cache.positions, self.cache.span = self.pos, span
        if self.attention == "flex":
            mask = decode_block_mask(self.pos, span)
        elif self.attention in ROW_LENGTHS:
            mask = (self.pos + 1).to(torch.int32).view(-1, 1, 1, 1)
        else:
            mask = self._additive((self.columns[None, :span] <= self.pos[:, None])[:, None, None])
        hidden = self.step_forward(input_ids=self.ids[:, None], position_ids=self.pos[:, None],
                                   attention_mask=mask, use_cache=True,
                                   **{self.cache_kw: self.cache}).last_hidden_state
        token = self.head(hidden[:, -1]).argmax(-1)
        live = ~self.done
        token = torch.where(live, token, self.ids)
        # Column n_gen <= max_new exists (one spare column): a finished row writes junk there.
        self.out[self.cache.row_ids, self.n_gen] = token
        self.n_gen.add_(live.long())
        self.done.logical_or_(live & (self._is_stop(token) | (self.n_gen >= self.limit)))
        self.pos.add_((~self.done).long())
        self.ids.copy_(token)

    def _step_once(self, span: int) -> None:
        if not self.use_graphs:
            self._step(span)
            return
        if span not in self.graphs:
            self._timed("capture_s", lambda: self.graphs.__setitem__(span, self._capture(span)))
            self.stats["captures"] = self.stats.get("captures", 0) + 1
        self.graphs[span].replay()

    def _capture(self, span: int) -> "torch.cuda.CUDAGraph":
        """The step at ``span`` captured; warm-up runs move the state, so it is put back."""
        state = [t.clone() for t in (self.ids, self.pos, self.n_gen, self.done, self.out)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(span)
        torch.cuda.current_stream().wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._step(span)
        # Warm-up K/V writes are harmless: each went to a position a real step rewrites
        # with the same values, or to a finished row's frozen position.
        for live, saved in zip((self.ids, self.pos, self.n_gen, self.done, self.out), state):
            live.copy_(saved)
        return graph
