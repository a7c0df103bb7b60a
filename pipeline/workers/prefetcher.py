"""The prefetcher: reads, tokenizes and batches samples, and hands out micro-batches in plan order.

It owns the step plan and a cursor into it, so every sample is handed out exactly once per
epoch, whichever target or drafter ends up with it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from pipeline.data import ChatDataset, DataConfig, collate
from pipeline.messages import MicroBatch, MicroBatchMeta
from pipeline.training.plan import StepPlan, job_plan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanSummary:
    num_samples: int
    sample_ids: tuple[int, ...]
    num_steps: int
    num_micro_batches: int
    steps_per_epoch: tuple[int, ...]
    samples_per_epoch: tuple[int, ...]  # planned; below num_samples where max_steps cuts
    data_summary: str


class Prefetcher:
    def __init__(self, train_path: str, tokenizer_path: str, data: DataConfig, block_size: int,
                 epochs: int, micro_batches_per_step: int, max_steps: Optional[int],
                 pad_token_id: int, pad_to: Optional[int]) -> None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.dataset = ChatDataset(train_path, tokenizer, data, block_size)
        log.info("data: %s", self.dataset.stats.summary())
        self.plans: list[StepPlan] = job_plan(self.dataset.sample_ids, data.seed, epochs,
                                              data.micro_batch_size, micro_batches_per_step,
                                              max_steps)
        self.pad_token_id = pad_token_id
        self.pad_to = pad_to
        # The flat order of (step, index) pairs; the cursor walks it.
        self.order = [(s, i) for s, plan in enumerate(self.plans)
                      for i in range(len(plan.micro_batches))]
        self.cursor = 0

    def summary(self) -> PlanSummary:
        per_epoch: dict[int, int] = {}
        samples: dict[int, int] = {}
        for plan in self.plans:
            per_epoch[plan.epoch] = per_epoch.get(plan.epoch, 0) + 1
            samples[plan.epoch] = samples.get(plan.epoch, 0) + len(plan.sample_ids)
        return PlanSummary(num_samples=len(self.dataset.sample_ids),
                           sample_ids=tuple(self.dataset.sample_ids), num_steps=len(self.plans),
                           num_micro_batches=len(self.order),
                           steps_per_epoch=tuple(per_epoch[e] for e in sorted(per_epoch)),
                           samples_per_epoch=tuple(samples[e] for e in sorted(samples)),
                           data_summary=self.dataset.stats.summary())

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
        batch = collate([self.dataset[i] for i in ids], self.pad_token_id, self.pad_to)
        meta = MicroBatchMeta(step=step, epoch=plan.epoch, index=index,
                              num_in_step=len(plan.micro_batches), sample_ids=tuple(ids),
                              shape=tuple(batch.input_ids.shape))
        return meta, MicroBatch(meta, batch.input_ids, batch.loss_mask, batch.lengths)

    def set_cursor(self, step: int) -> None:
        """Resume at the first micro-batch of ``step``."""
        self.cursor = next((k for k, (s, _) in enumerate(self.order) if s >= step),
                           len(self.order))
