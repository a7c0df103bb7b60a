"""What crosses actor boundaries besides the slot ring's own messages: small frozen records.

Token tensors of a micro-batch travel once through Ray's object store (the driver forwards
the reference without fetching it); hidden states never leave the GPUs (see transport/).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.checkpoint.writer import SaveDone


@dataclass(frozen=True)
class MicroBatchMeta:
    """Where a micro-batch sits in the plan; the driver schedules on this alone."""

    step: int           # global optimizer step (0-based)
    epoch: int
    index: int          # position within its step
    num_in_step: int    # micro-batches in this step
    sample_ids: tuple[int, ...]
    shape: tuple[int, int]  # (batch, sequence) of the padded token tensors


@dataclass(frozen=True)
class MicroBatch:
    meta: MicroBatchMeta
    input_ids: torch.Tensor  # [N, S] int64
    loss_mask: torch.Tensor  # [N, S] int64


@dataclass(frozen=True)
class MicroResult:
    """A drafter's report on one micro-batch (loss parts as plain numbers)."""

    drafter: int
    step: int
    epoch: int
    sample_ids: tuple[int, ...]
    numerator: float
    denominator: float
    correct: tuple[float, ...]
    total: tuple[float, ...]
    tokens: int
    start_s: float  # wall clock (time.time) when the work began, for the trace
    busy_s: float
    on_main_thread: bool


@dataclass(frozen=True)
class StepResult:
    """A drafter's report on an optimizer step."""

    drafter: int
    step: int
    denominator: float   # all-reduced over drafters: the step's global denominator
    grad_norm: float
    skipped: bool        # non-finite loss or gradient: no update (decided alike on all ranks)
    lr: float
    start_s: float
    busy_s: float
    reduce_start_s: float
    reduce_s: float
    max_memory_bytes: int
    param_checksum: float  # sum of parameters: replicas must agree
    on_main_thread: bool
    cudagraph_skips: int  # graphs inductor declined to capture (reduce-overhead only)
    # Checkpoint writes that finished in the background since the last step (rank 0 only).
    saves: tuple[SaveDone, ...] = ()


