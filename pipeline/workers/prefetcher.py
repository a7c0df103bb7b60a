"""The prefetcher: batches samples and hands out micro-batches in plan order.

It gets the training set already encoded (the driver reads, checks and encodes the file once,
before Ray starts: pipeline/job/job_data.py), owns the step plan and a cursor into it, so every
sample is handed out exactly once per epoch, whichever target or drafter ends up with it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from pipeline.checkpoint.point import ResumePoint
from pipeline.data import ChatDataset, DataConfig
from pipeline.data.batching import BatchShapes, sample_lengths
from pipeline.training.plan import StepPlan, job_plan
from pipeline.workers.messages import MicroBatch, MicroBatchMeta

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanSummary:
    first_step: int          # global index of the first planned step (0 unless resuming)
    num_samples: int
    sample_ids: tuple[int, ...]
    num_steps: int
    num_micro_batches: int
    step_epochs: tuple[int, ...]   # epoch of each planned step
    step_samples: tuple[int, ...]  # samples in each planned step

    @property
    def end_step(self) -> int:
        return self.first_step + self.num_steps

    def samples_planned(self, epoch: int) -> int:
        return sum(n for e, n in zip(self.step_epochs, self.step_samples) if e == epoch)


class Prefetcher:
    def __init__(self, *, dataset: ChatDataset, data: DataConfig, epochs: int,
                 micro_batches_per_step: int, max_steps: Optional[int], pad_token_id: int,
                 shapes: BatchShapes, resume: Optional[ResumePoint] = None) -> None:
        self.dataset = dataset
        self.data = data
        self.epochs = epochs
        self.micro_batches_per_step = micro_batches_per_step
        self.max_steps = max_steps
        self.pad_token_id = pad_token_id
        # Micro-batch shapes: padded to one width, or cut and padded per length bucket.
        self.shapes = shapes
        self.lengths = sample_lengths(self.dataset) if shapes.bucketed else None
        self.anchors = shapes.anchor_counts(self.dataset) if shapes.packed else None
        self.replan(resume)

    def replan(self, resume: Optional[ResumePoint]) -> "PlanSummary":
        """Plan from ``resume`` and hand out from its first micro-batch (after a restart of
        the drafters, the data need not be read and tokenized again)."""
        resume = resume or ResumePoint(0, 0, 0)
        self.first_step = resume.step
        self.plans: list[StepPlan] = job_plan(
            self.dataset.sample_ids, self.data.seed, self.epochs, self.data.micro_batch_size,
            self.micro_batches_per_step, self.max_steps, start_epoch=resume.epoch,
            samples_done=resume.samples_done, steps_done=resume.step, shapes=self.shapes,
            lengths=self.lengths, anchors=self.anchors)
        # The flat order of (step, index) pairs; the cursor walks it.
        self.order = [(s, i) for s, plan in enumerate(self.plans)
                      for i in range(len(plan.micro_batches))]
        self.cursor = 0
        return self.summary()

    def summary(self) -> PlanSummary:
        return PlanSummary(first_step=self.first_step, num_samples=len(self.dataset.sample_ids),
                           sample_ids=tuple(self.dataset.sample_ids), num_steps=len(self.plans),
                           num_micro_batches=len(self.order),
                           step_epochs=tuple(p.epoch for p in self.plans),
                           step_samples=tuple(len(p.sample_ids) for p in self.plans))

    def next_micro_batch(self) -> tuple[Optional[MicroBatchMeta], Optional[MicroBatch]]:
        """The next micro-batch of the plan, as (meta, batch); (None, None) once exhausted.

        Called with num_returns=2 so the driver fetches only the meta and forwards the batch
        by reference.
        """
        if self.cursor >= len(self.order):
            return None, None
        step, index = self.order[self.cursor]
        self.cursor += 1
        plan = self.plans[step]
        ids = plan.micro_batches[index]
        batch = self.shapes.collate([self.dataset[i] for i in ids], self.pad_token_id)
        meta = MicroBatchMeta(step=self.first_step + step, epoch=plan.epoch, index=index,
                              num_in_step=len(plan.micro_batches), sample_ids=tuple(ids),
                              shape=tuple(batch.input_ids.shape))
        return meta, MicroBatch(meta, batch.input_ids, batch.loss_mask)

