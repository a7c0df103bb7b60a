"""``train.eval``: tau (acceptance length) on held-out prompts, before, during and after."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pipeline.checks.validate import require, require_choice

CUDA_GRAPHS = ("auto", "on", "off")
STREAM_PRIORITIES = ("low", "default")


@dataclass(frozen=True)
class DecodeOptions:
    """How the evaluator decodes (pipeline/eval/batched.py); built from :class:`EvalConfig`."""

    batch_size: int
    cuda_graphs: str
    stream_priority: str
    gpu_duty: float

    def graphs_on(self, device_type: str) -> bool:
        """Whether the verify and draft steps run as captured CUDA graphs on ``device_type``."""
        if self.cuda_graphs == "on" and device_type != "cuda":
            raise ValueError(f"train.eval.cuda_graphs='on' is not allowed on {device_type}: "
                             f"expected 'auto' or 'off' (CUDA graphs need a CUDA device)")
        return self.cuda_graphs == "on" or (self.cuda_graphs == "auto" and device_type == "cuda")


@dataclass
class EvalConfig:
    # Every N steps (0: only before and after training; -1: never).
    every: int = 0
    prompts: int = 16
    max_new_tokens: int = 64
    # The evaluator is an actor of its own (it holds a full target). On CUDA it takes this
    # fraction of a GPU; the cluster preset must leave that much free beside its groups.
    gpus: float = 0.1
    # Prompts decoded at once (shared cache columns, pipeline/eval/batched.py); 1: one at a
    # time, the reference path. Families without the fast path go one at a time anyway.
    batch_size: int = 32
    # The verify and draft steps as captured CUDA graphs: auto = on CUDA only.
    cuda_graphs: str = "auto"
    # On CUDA, the evaluator's kernels go to a stream of this priority ("low": the lowest the
    # device has, behind any stream of the same process that asks for more).
    stream_priority: str = "low"
    # On CUDA, the share of wall time the evaluator keeps its GPU busy: after each decoding
    # round it waits until its busy time is at most this share (1: never waits). Kernels of
    # two processes on one GPU take turns, so training keeps 1 - duty/2 of the GPU while an
    # evaluation runs beside it: at the 8B shape on one H200, +10.4% on a step at duty 0.2
    # and +101% at 1.0 (docs/BENCHMARKS.md), as that predicts. 0.15 predicts +8%; measured
    # +10.5% (median step, 2026-12-04) over a 10-step window that held one round of 20.8 s,
    # when the prefill and the graph captures before the first round were not paced (they
    # are since, unmeasured).
    gpu_duty: float = 0.15
    # How drafter rank 0 hands the evaluator its weights: true, through a one-slot ring on
    # its device (a copy there, CUDA IPC or CPU shared memory; its size in device memory, 4.2
    # GB at the 8B recipe, kept for the job); false, as a CPU copy through Ray's object store
    # (4.2 GB at the 8B recipe, copied and serialised in rank 0's thread while training waits
    # for it: with a checkpoint beside it, 10-12 s of steps each time on one H200; through the
    # ring the next step took 0.725 s against a median of 0.721, docs/BENCHMARKS.md). null:
    # the ring wherever it applies (replicated drafters, the evaluator on rank 0's node),
    # else the object store.
    weights_ring: Optional[bool] = None

    def __post_init__(self) -> None:
        require(self.every >= -1, "train.eval.every", self.every, ">= -1")
        require(self.prompts >= 0, "train.eval.prompts", self.prompts, ">= 0 (0: no eval)")
        # The first new token is the target's own: with one, no drafting round runs and no
        # tau can come out.
        require(self.max_new_tokens >= 2, "train.eval.max_new_tokens", self.max_new_tokens,
                ">= 2 (the first new token is the target's own; tau needs a drafting round)")
        require(0 < self.gpus <= 1, "train.eval.gpus", self.gpus,
                "in (0, 1]: a fraction of a GPU beside the training actors")
        require(self.batch_size >= 1, "train.eval.batch_size", self.batch_size,
                ">= 1 (1: prompt by prompt, the reference path)")
        require_choice("train.eval.cuda_graphs", self.cuda_graphs, CUDA_GRAPHS)
        require_choice("train.eval.stream_priority", self.stream_priority, STREAM_PRIORITIES)
        require(0 < self.gpu_duty <= 1, "train.eval.gpu_duty", self.gpu_duty,
                "in (0, 1]: the share of wall time the evaluator may keep the GPU busy")

    def decode_options(self) -> DecodeOptions:
        return DecodeOptions(batch_size=self.batch_size, cuda_graphs=self.cuda_graphs,
                             stream_priority=self.stream_priority, gpu_duty=self.gpu_duty)

    def due_between(self, steps_done: int, end_step: int) -> bool:
        """tau after ``steps_done`` steps, between steps: every ``every`` steps, not at the end
        (the run's closing evaluation is its caller's). The pipeline's driver and the reference
        trainer both ask here."""
        return self.every > 0 and steps_done % self.every == 0 and steps_done < end_step

    @property
    def off(self) -> Optional[str]:
        """The setting that turns tau evaluation off, or None when it is on."""
        if self.every < 0:
            return f"train.eval.every={self.every}"
        if self.prompts == 0:
            return "train.eval.prompts=0"
        return None
