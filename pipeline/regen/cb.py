"""Regeneration on transformers' continuous-batching engine (``generate_batch``'s manager).

The engine keeps a paged KV cache and lets requests join and leave the running batch between
decode steps, so the batch stays full while answers of different lengths finish; on CUDA it
can compile its steps and capture them in CUDA graphs. We drive its manager directly rather
than through ``generate_batch`` for one reason: a multi-turn conversation's next turn can
join the batch the moment its previous answer is back, instead of waiting for the whole round.

Greedy decoding, stop tokens and ``max_new_tokens`` are the generation config's, as with
``generate``; each answer is cut at its first stop token by :func:`greedy.cut_at_stop`, so
both engines store exactly the same turns (``tests/regen/test_regen_cb.py`` checks it token
for token on CPU).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from transformers import GenerationConfig

from pipeline.regen.greedy import cut_at_stop, render_prompt, store_turn, with_answer_slots
from pipeline.regen.messages import GenRequest, Message, TurnResult

log = logging.getLogger(__name__)

ENGINES = ("static", "cb", "generate")
SWITCHES = ("auto", "on", "off")
COMPILE_LEVELS = (0, 1, 2, 3)


@dataclass(frozen=True)
class CbOptions:
    """The engine's knobs that matter for speed; ``None``/``auto``: the library decides."""

    max_batch_tokens: Optional[int] = None  # tokens per forward (prefill chunks + decodes)
    num_blocks: Optional[int] = None  # KV cache pages; None: sized from free GPU memory
    max_requests: Optional[int] = None  # requests in one forward (the library's fallback 1024)
    page_size: Optional[int] = None  # tokens per cache page (the library's default 256)
    max_memory_percent: Optional[float] = None  # of free GPU memory for the cache
    cuda_graphs: str = "auto"  # on/off/auto (auto: the library's choice)
    compile_level: int = 0  # the library's default_compile_level: 0 (eager) .. 3
    async_batching: str = "auto"  # double-buffered batches (more memory, less CPU in the loop)
    warmup: bool = True  # capture graphs at the largest sizes before the first requests

    def __post_init__(self) -> None:
        from pipeline.checks.validate import require, require_choice

        for key in ("max_batch_tokens", "num_blocks", "max_requests", "page_size"):
            value = getattr(self, key)
            require(value is None or (isinstance(value, int) and not isinstance(value, bool)
                                      and value >= 1), _flag(key), value,
                    "an integer >= 1, or unset")
        if self.max_memory_percent is not None:
            require(0 < self.max_memory_percent <= 1, _flag("max_memory_percent"),
                    self.max_memory_percent, "in (0, 1]")
        require_choice(_flag("cuda_graphs"), self.cuda_graphs, SWITCHES)
        require_choice(_flag("async_batching"), self.async_batching, SWITCHES)
        require_choice(_flag("compile_level"), self.compile_level, COMPILE_LEVELS)

    def describe(self) -> dict:
        return dataclasses.asdict(self)


def _flag(key: str) -> str:
    """The command-line flag of a field (pipeline.regenerate and the bench share them)."""
    return "--cb-" + key.replace("_", "-")


def _switch(value: str) -> Optional[bool]:
    return None if value == "auto" else value == "on"


# On CPU the library would size the cache from free RAM (60% of it: tens of GB to allocate,
# a minute before the first token); CPU runs are tests and small jobs, so a small cache.
CPU_DEFAULTS = {"num_blocks": 64, "page_size": 64, "max_batch_tokens": 512}


def build_cb_config(options: CbOptions, device_type: str = "cuda"):
    """The library's ContinuousBatchingConfig; field names differ across versions (5.17 calls
    the page size ``block_size``), so only fields the installed version has are set."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    if device_type == "cpu":
        options = dataclasses.replace(options, **{k: v for k, v in CPU_DEFAULTS.items()
                                                  if getattr(options, k) is None})

    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    page_key = "page_size" if "page_size" in fields else "block_size"
    wanted = {"max_batch_tokens": options.max_batch_tokens, "num_blocks": options.num_blocks,
              "max_requests_per_batch": options.max_requests, page_key: options.page_size,
              "max_memory_percent": options.max_memory_percent,
              "use_cuda_graph": _switch(options.cuda_graphs),
              "use_async_batching": _switch(options.async_batching),
              "default_compile_level": options.compile_level}
    return ContinuousBatchingConfig(**{k: v for k, v in wanted.items()
                                       if v is not None and k in fields})


def cb_unsupported(model) -> Optional[str]:
    """Why the engine cannot serve ``model`` here, or None."""
    if not hasattr(model, "continuous_batching_context_manager"):
        return f"{type(model).__name__} has no continuous batching in this transformers"
    return None


class CbSession:
    """One model's engine, created on first use and kept between calls (its cache is sized,
    and on CUDA its graphs captured, once per worker)."""

    _ids = itertools.count()

    def __init__(self, model, tokenizer, config: GenerationConfig, stops: Sequence[int],
                 options: CbOptions, enable_thinking: bool) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.config, self.stops = config, list(stops)
        self.options, self.enable_thinking = options, enable_thinking
        self.cb_config = build_cb_config(options, model.device.type)
        # The engine switches the model to a paged attention ("paged|sdpa"), on which a plain
        # forward fails; close() puts the original back (transformers 5.17 does not always).
        self.attn_implementation = model.config._attn_implementation

    def _hints(self, longest_prompt: int):
        """Sizing hints for the first call (the engine is sized once): the block table must
        hold the longest sequence any later call may bring, so prompts are bounded by the
        model's context rather than this call's; no request count, so the batch size is the
        library's (or --cb-max-requests), not this call's."""
        from transformers.generation.continuous_batching.utils import WorkloadHints

        context = int(getattr(self.model.config, "max_position_embeddings", 0) or 32768)
        longest = max(longest_prompt, context - self.config.max_new_tokens)
        return WorkloadHints(max_prompt_length=longest,
                             max_generated_length=self.config.max_new_tokens, num_requests=0)

    def _engine(self, longest_prompt: int):
        """The engine as a context: created (and warmed up) on first use, started on enter,
        stopped and kept for the next call on exit."""
        return self.model.continuous_batching_context_manager(
            generation_config=self.config, continuous_batching_config=self.cb_config,
            persistent_manager=True, warmup=self.options.warmup, block=True,
            workload_hints=self._hints(longest_prompt))

    def start(self) -> None:
        """Build the engine now (cache, warm-up), so that a model or device it cannot serve
        shows at start-up, where falling back is still clean, and not mid-job."""
        with self._engine(0):
            pass

    def _prompt(self, conv: list[Message], pos: int) -> list[int]:
        text = render_prompt(self.tokenizer, conv[:pos], self.enable_thinking)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def regenerate(self, requests: Sequence[GenRequest]
                   ) -> list[tuple[list[Message], list[TurnResult]]]:
        """Each conversation with its assistant turns regenerated; a conversation's next turn
        joins the engine as soon as its previous answer is back."""
        slots = [with_answer_slots(r.messages) for r in requests]
        turns: list[list[TurnResult]] = [[] for _ in requests]

        def answered(i: int, tokens: list[int]) -> Optional[list[int]]:
            conv, positions = slots[i]
            turn = cut_at_stop(self.tokenizer, tokens, self.stops)
            turns[i].append(store_turn(self.tokenizer, conv, positions[len(turns[i])], turn,
                                       self.stops, self.enable_thinking))
            done = len(turns[i])
            return self._prompt(conv, positions[done]) if done < len(positions) else None

        self.run({i: self._prompt(conv, pos[0]) for i, (conv, pos) in enumerate(slots) if pos},
                 answered)
        return [(conv, t) for (conv, _), t in zip(slots, turns)]

    def decode_ids(self, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
        """The engine's raw greedy tokens for token-id prompts (stop token included if any)."""
        out: dict[int, list[int]] = {}

        def answered(i: int, tokens: list[int]) -> None:
            out[i] = list(tokens)

        self.run({i: list(p) for i, p in enumerate(prompts)}, answered)
        return [out[i] for i in range(len(prompts))]

    def run(self, first: dict[int, list[int]],
            answered: Callable[[int, list[int]], Optional[list[int]]]) -> None:
        """Serve ``first`` (key -> prompt ids) through the engine; ``answered(key, tokens)``
        gets each answer and may return the key's next prompt, which joins at once."""
        if not first:
            return
        call = next(self._ids)
        round_of = dict.fromkeys(first, 0)
        with self._engine(max(map(len, first.values()))) as manager:
            def submit(key: int, ids: list[int]) -> None:
                rid = manager.add_request(ids, request_id=f"c{call}-{key}-{round_of[key]}",
                                          max_new_tokens=self.config.max_new_tokens)
                if rid is None:
                    raise RuntimeError("the continuous-batching engine refused a request "
                                       "(its queue is closed)")

            for key, ids in first.items():
                submit(key, ids)
            outstanding = len(first)
            while outstanding:
                out = manager.get_result(timeout=1)
                if out is None:
                    if not manager.is_running():
                        raise RuntimeError("the continuous-batching engine stopped with "
                                           f"{outstanding} request(s) unanswered")
                    continue
                if not out.is_finished():
                    continue
                if out.error is not None:
                    raise RuntimeError(f"continuous batching failed request "
                                       f"{out.request_id}: {out.error}")
                key = int(out.request_id.split("-")[1])
                outstanding -= 1
                following = answered(key, list(out.generated_tokens))
                if following is not None:
                    round_of[key] += 1
                    submit(key, following)
                    outstanding += 1

    def close(self) -> None:
        """Free the engine's cache (a new one is built on the next call)."""
        destroy = getattr(self.model, "destroy_cached_continuous_batching_manager", None)
        if destroy is not None:
            destroy()
        if self.model.config._attn_implementation != self.attn_implementation:
            self.model.set_attn_implementation(self.attn_implementation)
