"""The job-wide assembly of batches and steps, shared by the Ray pipeline and the reference
trainer (pipeline/reference/trainer.py): how micro-batches are cut and padded, how the drafter
packs them, and the step plan both follow. One place, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Optional

from pipeline.job.config import JobConfig
from pipeline.data import ChatDataset
from pipeline.data.batching import BatchShapes, sample_lengths
from pipeline.objective.packing import Packing
from pipeline.training.plan import StepPlan, job_plan


def batch_shapes(job: JobConfig) -> BatchShapes:
    """How the job cuts and pads micro-batches (the Ray pipeline's prefetcher gets the same)."""
    return BatchShapes.from_config(job.data, job.drafter.static_shapes, job.drafter.num_anchors)


def packing_of(job: JobConfig) -> Optional[Packing]:
    """data.batching=pack: the drafter's packed sequence and anchor pool; else None."""
    shapes = batch_shapes(job)
    if not shapes.packed:
        return None
    return Packing(job.data.resolved_tokens_per_micro_batch(), shapes.pool)


def plan_for(job: JobConfig, dataset: ChatDataset) -> list[StepPlan]:
    """The job's step plan: num_drafters * grad_accum micro-batches per step."""
    plan, shapes = job.train.plan, batch_shapes(job)
    return job_plan(dataset.sample_ids, job.data.seed, plan.epochs, job.data.micro_batch_size,
                    job.cluster.num_drafters * plan.grad_accum, plan.max_steps, shapes=shapes,
                    lengths=sample_lengths(dataset) if shapes.bucketed else None,
                    anchors=shapes.anchor_counts(dataset) if shapes.packed else None)
