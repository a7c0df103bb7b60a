"""The tau evaluator: its own actor, so an evaluation never holds up the training step.

The driver asks drafter rank 0 for a copy of its weights right behind a step (a call that the
drafter runs in order, so the copy is exactly the weights after that step) and hands the
returned ref to this worker: a snapshot in rank 0's ring on its device, which this worker
copies out of, or a CPU copy that Ray resolves here out of the object store
(pipeline/workers/weights.py), while the drafters go on training; the driver logs the result
at the step the weights belong to.

The full target this worker needs is loaded on the first evaluation and kept for the next ones
(it is this process's only job); :meth:`EvalWorker.close` frees it. Drafter rank 0 no longer
keeps one, nor pauses the all-reduce of the other ranks for as long as an evaluation takes.
"""

from __future__ import annotations

import gc
import logging
import math
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch

from pipeline.eval.config import DecodeOptions, EvalConfig
from pipeline.eval.tau import evaluate_tau, load_full_target
from pipeline.model.config import DrafterSpec
from pipeline.model.drafter import DFlashDrafter
from pipeline.model.families import embed_scale
from pipeline.model.target import TargetHead
from pipeline.transport.node import current_node_id
from pipeline.transport.ring import RingReader
from pipeline.workers.common import actor_device
from pipeline.workers.weights import Weights, WeightsSnapshot, unpack

log = logging.getLogger(__name__)

# An error's message in the one line the driver shows (a state-dict mismatch lists every key).
_MAX_MESSAGE = 400


@dataclass(frozen=True)
class EvalResult:
    """tau of the weights after ``step`` steps, and what the evaluation cost."""

    step: int
    tau: float
    num_prompts: int
    seconds: float
    # Why the evaluation failed (tau is nan then): an eval that runs out of memory costs its
    # figure, not the training job.
    error: Optional[str] = None
    # How the weights came: "ring" (drafter rank 0's snapshot) or "object store".
    weights_by: str = ""


class EvalWorker:
    def __init__(self, *, spec: DrafterSpec, target_path: str, device: str,
                 target_dtype: torch.dtype, prompts: Sequence[Sequence[int]],
                 max_new_tokens: int, eos_token_id: Optional[int],
                 decode: Optional[DecodeOptions] = None) -> None:
        """``target_dtype`` is what the drafter's own evaluation used: its autocast dtype, or
        float32 when it trains in fp32. The drafter itself is evaluated in fp32, as trained.
        ``decode``: how prompts are decoded (train.eval's batch_size, cuda_graphs, ...;
        default: its defaults)."""
        self.device = actor_device(device)
        self.target_path = target_path
        self.target_dtype = target_dtype
        self.prompts = [list(p) for p in prompts]
        self.max_new_tokens = max_new_tokens
        self.eos_token_id = eos_token_id
        self.decode = decode or EvalConfig().decode_options()
        self.decode.graphs_on(self.device.type)  # refuse graphs=on without CUDA now, not later
        self.drafter: Optional[DFlashDrafter] = DFlashDrafter.for_loading(spec, self.device)
        self._target: Optional[torch.nn.Module] = None
        # Drafter rank 0's weights snapshot ring, opened at the first snapshot (weights.py).
        self.reader = RingReader(self.device, node_id=current_node_id())

    def node_id(self) -> Optional[str]:
        """The node this evaluator runs on: the driver lets a snapshot come only from there."""
        return current_node_id()

    def evaluate(self, weights: Weights | WeightsSnapshot, step: int) -> EvalResult:
        """tau of ``weights`` (a drafter's state dict, or a snapshot of it in drafter rank 0's
        ring) on the held-out prompts."""
        assert self.drafter is not None, "evaluate after close"
        t0 = time.perf_counter()
        by = "ring" if isinstance(weights, WeightsSnapshot) else "object store"
        try:
            tau = self._evaluate(weights)
        except Exception as e:  # reported to the driver, which trains on without this figure
            # The driver shows each distinct error once, in one line that says where it was
            # raised; the traceback stays at debug level (it would repeat every evaluation).
            log.debug("tau after step %d failed", step, exc_info=True)
            return EvalResult(step=step, tau=math.nan, num_prompts=len(self.prompts),
                              seconds=time.perf_counter() - t0, error=error_line(e),
                              weights_by=by)
        finally:
            self._release_cached()
        seconds = time.perf_counter() - t0
        log.info("tau after step %d: %.3f (%d prompts, %.1fs)", step, tau, len(self.prompts),
                 seconds)
        return EvalResult(step=step, tau=tau, num_prompts=len(self.prompts), seconds=seconds,
                          weights_by=by)

    def _release_cached(self) -> None:
        """Between evaluations this process holds the target and the drafter copy only: the
        evaluation's caches, graph pools and activations go back to the device, where a
        drafter or target sharing the GPU can take them. At the 8B shape on one 80 GB H100
        (2026-12-05) the evaluator held 26.3 GiB after its first evaluation, about 7 GB more
        than its target and drafter copy, and the drafter beside it then ran out of memory at
        its first step."""
        if self.device.type != "cuda":
            return
        gc.collect()  # a graph or cache still referenced from a cycle keeps its blocks
        torch.cuda.empty_cache()

    def _evaluate(self, weights: Weights | WeightsSnapshot) -> float:
        # The weights first: a snapshot is read while the drafter that wrote it surely lives
        # (the target's first load takes a while).
        self._load(weights)
        del weights  # the copy the object store handed us; the drafter holds its own now
        if self._target is None:
            self._target = load_full_target(self.target_path, self.device.type,
                                            self.target_dtype)
        # The target's own embedding and head, shared: a copy per evaluation cost 5 GB of
        # device memory at the Qwen3-8B shape (both in fp32), on a card the evaluator shares.
        head = TargetHead.of_model(self._target, embed_scale(self._target.config.to_dict()))
        return evaluate_tau(self._target, self.drafter, head, self.prompts,
                            self.max_new_tokens, self.eos_token_id, self.decode)

    def _load(self, weights: Weights | WeightsSnapshot) -> None:
        if not isinstance(weights, WeightsSnapshot):
            self.drafter.load_state_dict(weights)
            return
        self.reader.attach(weights.ring)  # once per ring: a restarted drafter makes a new one
        self.drafter.load_state_dict(unpack(self.reader.view(weights.ready), weights.layout))
        self.reader.release_view(weights.ready)  # the copies have landed

    def holds_target(self) -> bool:
        return self._target is not None

    def close(self) -> None:
        """Free the target and the drafter copy (the process may live on in Ray's pool)."""
        self._target = None
        self.drafter = None
        self.reader.close()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def error_line(error: BaseException) -> str:
    """``Type: message (at file.py:line in function)`` on one line, the message cut at
    :data:`_MAX_MESSAGE` characters."""
    text = " ".join(str(error).split())
    if len(text) > _MAX_MESSAGE:
        text = text[:_MAX_MESSAGE - 3] + "..."
    line = f"{type(error).__name__}: {text}"
    frames = traceback.extract_tb(error.__traceback__)
    if frames:
        last = frames[-1]
        line += f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"
    return line
