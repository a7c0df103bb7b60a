"""Which samples go into which micro-batch of which optimizer step.

The plan depends only on (sample ids, seed, epoch, micro-batch shapes, micro-batches per step;
with length buckets also the samples' lengths), so the single-process trainer and the Ray
pipeline train the same samples in the same steps. The last step of an epoch may hold fewer
micro-batches and a micro-batch fewer samples: no sample is dropped, and exact normalisation
makes uneven steps correct.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from pipeline.data import epoch_order, micro_batches
from pipeline.data.batching import BatchShapes


@dataclass(frozen=True)
class StepPlan:
    epoch: int
    index: int  # step index within the epoch
    micro_batches: tuple[tuple[int, ...], ...]

    @property
    def sample_ids(self) -> list[int]:
        return [sid for mb in self.micro_batches for sid in mb]


def epoch_micro_batches(sample_ids: Sequence[int], seed: int, epoch: int, micro_batch_size: int,
                        skip: int = 0, shapes: Optional[BatchShapes] = None,
                        lengths: Optional[Mapping[int, int]] = None,
                        anchors: Optional[Mapping[int, int]] = None) -> list[tuple[int, ...]]:
    """The epoch's micro-batches, less those holding its first ``skip`` trained samples.

    Padded micro-batches are consecutive chunks of the epoch order, so a resume skips samples
    and chunks the rest. Bucketed ones are not: the epoch's whole micro-batch sequence is
    planned again and its first micro-batches, which together hold exactly ``skip`` samples,
    are left out. A ``skip`` that falls inside a micro-batch cannot come from this plan.
    """
    order = epoch_order(list(sample_ids), seed, epoch)
    if shapes is None or not shapes.bucketed:
        return [tuple(mb) for mb in micro_batches(order[skip:], micro_batch_size)]
    assert lengths is not None, "bucketed micro-batches need every sample's length"
    mbs = shapes.micro_batches(order, lengths, seed, epoch, anchors)
    done = first = 0
    while done < skip and first < len(mbs):
        done += len(mbs[first])
        first += 1
    if done != skip:
        raise ValueError(
            f"the resume point says {skip} samples of epoch {epoch} were trained, but no "
            f"prefix of that epoch's bucketed micro-batches holds exactly {skip} samples: the "
            f"checkpoint was taken with another data.batching, data.buckets, "
            f"data.tokens_per_micro_batch, data.anchors_per_micro_batch or drafter.num_anchors;"
            f" resume with those")
    return [tuple(mb) for mb in mbs[first:]]


def epoch_plan(sample_ids: Sequence[int], seed: int, epoch: int, micro_batch_size: int,
               micro_batches_per_step: int, skip: int = 0, shapes: Optional[BatchShapes] = None,
               lengths: Optional[Mapping[int, int]] = None,
               anchors: Optional[Mapping[int, int]] = None) -> list[StepPlan]:
    """Steps of one epoch; ``skip`` leaves out its first trained samples (a resume)."""
    mbs = epoch_micro_batches(sample_ids, seed, epoch, micro_batch_size, skip, shapes, lengths,
                              anchors)
    return [StepPlan(epoch, i // micro_batches_per_step,
                     tuple(mbs[i:i + micro_batches_per_step]))
            for i in range(0, len(mbs), micro_batches_per_step)]


def job_plan(sample_ids: Sequence[int], seed: int, epochs: int, micro_batch_size: int,
             micro_batches_per_step: int, max_steps: int | None = None,
             start_epoch: int = 0, samples_done: int = 0,
             steps_done: int = 0, shapes: Optional[BatchShapes] = None,
             lengths: Optional[Mapping[int, int]] = None,
             anchors: Optional[Mapping[int, int]] = None) -> list[StepPlan]:
    """The optimizer steps still to take, epochs concatenated, ending at ``max_steps``.

    A resume passes its cursor (``start_epoch``, ``samples_done`` in it, ``steps_done``): the
    rest of that epoch is re-planned from the same order, so with an unchanged layout the
    steps are exactly those an uninterrupted run would take, and with a different number of
    drafters every remaining sample is still trained exactly once. Bucketed ``shapes`` need
    ``lengths`` (sample id -> tokens), packed ones also ``anchors`` (sample id -> anchors);
    padded ones cut ``micro_batch_size`` samples per micro-batch.
    """
    plans = []
    for epoch in range(start_epoch, epochs):
        skip = samples_done if epoch == start_epoch else 0
        plans += epoch_plan(sample_ids, seed, epoch, micro_batch_size, micro_batches_per_step,
                            skip, shapes, lengths, anchors)
    if not max_steps:
        return plans
    # A checkpoint may already hold max_steps or more: nothing is left (never a negative slice).
    return plans[: max(0, max_steps - steps_done)]
