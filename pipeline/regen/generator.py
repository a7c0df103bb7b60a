"""A generator worker: the target on one device, answering conversations greedily.

A plain class: :func:`pipeline.runtime.ray_start.start_actor` makes it an actor (one per GPU), and
tests build it directly on CPU.
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.regen.cb import CbOptions, CbSession, cb_unsupported
from pipeline.regen.config import compile_choice
from pipeline.regen.greedy import (ensure_pad_token, greedy_config, regenerate_batch,
                                   static_round, stop_token_ids)
from pipeline.regen.messages import GenRequest, GenResult, TurnResult
from pipeline.workers.common import actor_device, on_main_thread

log = logging.getLogger(__name__)


class GeneratorWorker:
    def __init__(self, *, rank: int, target_path: str, device: str, dtype: torch.dtype,
                 max_new_tokens: int, enable_thinking: bool = True, engine: str = "static",
                 cb_options: Optional[CbOptions] = None, static_rows: int = 512,
                 static_attention: str = "auto", static_compile: Optional[bool] = None,
                 static_compile_prefill: Optional[bool] = None,
                 answer_tokens: Optional[int] = None) -> None:
        self.rank = rank
        self.enable_thinking = enable_thinking
        self.device = actor_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(target_path)
        # Left padding: every row's answer then starts in the same column of the batch.
        self.tokenizer.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(target_path, dtype=dtype)
        self.model.to(self.device).eval()
        self.stops = stop_token_ids(self.model, self.tokenizer)
        pad_id = ensure_pad_token(self.tokenizer)
        self.config = greedy_config(self.stops, pad_id, max_new_tokens)
        self.cb: Optional[CbSession] = None
        if engine == "cb":
            self.cb = self._start_cb(cb_options or CbOptions())
        self.engine = "cb" if self.cb is not None else "generate"
        # One static decoder for the worker's life: its cache and captured graphs serve
        # every call that fits them (pipeline.regen.static_engine.StaticEngine).
        self.static = None
        how = ""
        if engine == "static" and self._static_serves():
            from pipeline.regen.static_attention import resolve_attention
            from pipeline.regen.static_engine import StaticEngine

            self.engine = "static"
            param = next(self.model.parameters())
            attention = resolve_attention(static_attention, param.device, param.dtype)
            # None (auto) decided here, where the model's size and the device are known;
            # ``answer_tokens`` is this worker's share of the run's answers at most.
            compiles = compile_choice(static_compile, static_compile_prefill, attention,
                                      param.device.type,
                                      sum(p.numel() for p in self.model.parameters()),
                                      answer_tokens)
            how = (f" ({static_rows} rows, {attention} attention"
                   f"{' picked by auto' if static_attention == 'auto' else ''}; "
                   f"{compiles.note()})")
            self.static = StaticEngine(self.model, static_rows, attention=attention,
                                       compile_step=compiles.step,
                                       compile_prefill=compiles.prefill)
        self.description = (f"generator {rank}: {target_path} on {self.device} ({dtype}), "
                            f"engine {self.engine}{how}, stop ids {self.stops}")
        log.info("%s", self.description)

    def describe(self) -> str:
        """One line: the model, the device, the engine that answers and how, the stop ids.
        Ray drops an actor's info lines, so the driver asks for this one and logs it."""
        return self.description

    def engine_counts(self) -> dict:
        """The static engine's events that cost speed, over the worker's life: prompts decoded
        apart (too long for the kept cache) and cache builds (each one captures, and compiles,
        again). Empty for the other engines. Asked by the driver, which reports them."""
        engine = self.static
        if engine is None:
            return {}
        return {"decoded_apart": engine.apart, "longest_apart": engine.apart_longest,
                "cache_builds": engine.builds, "rows": engine.batch_size,
                "columns": engine.apart_columns}

    def _static_serves(self) -> bool:
        """Whether the static-cache engine serves this model; else one line and generate."""
        from pipeline.regen.static_cache import check_supported

        try:
            check_supported(self.model)
            return True
        except ValueError as e:
            log.warning("generator %d: the static engine cannot serve this model (%s): "
                        "falling back to generate", self.rank, e)
            return False

    def _start_cb(self, options: CbOptions) -> Optional[CbSession]:
        """The engine, started; None, after one log line saying why, where it cannot serve
        this model on this device (then ``generate`` answers instead)."""
        reason = cb_unsupported(self.model)
        if reason is None:
            session = CbSession(self.model, self.tokenizer, self.config, self.stops, options,
                                self.enable_thinking)
            try:
                session.start()
                return session
            except Exception as e:  # noqa: BLE001 - any start-up failure means: not here
                session.close()
                reason = f"{type(e).__name__}: {e}"
        log.warning("generator %d: continuous batching cannot serve this model here (%s): "
                    "falling back to generate", self.rank, reason)
        return None

    def generate(self, batch: Sequence[GenRequest]) -> list[GenResult]:
        """Every assistant turn of every conversation in ``batch`` regenerated, in order."""
        if self.cb is not None:
            done = self.cb.regenerate(batch)
        else:
            decode = None
            if self.engine == "static":
                def decode(prompts: list[str]) -> list[TurnResult]:
                    return static_round(self.static, self.tokenizer, prompts, self.config,
                                        self.stops)
            done = regenerate_batch(self.model, self.tokenizer, batch, self.config, self.stops,
                                    self.enable_thinking, decode)
        main = on_main_thread()
        return [GenResult(line_index=r.line_index, messages=tuple(messages),
                          turns=tuple(turns), on_main_thread=main)
                for r, (messages, turns) in zip(batch, done)]
