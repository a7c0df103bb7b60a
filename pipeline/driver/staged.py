"""Staged targets in the actor group: start a target as ``target.stages`` actors, wire them,
and chain one micro-batch through them.

A staged target is a chain of :class:`~pipeline.workers.stage_worker.TargetStageWorker`
actors on one node; its last stage owns the tap ring and stands for the target everywhere
the driver deals with targets (ring handles, slot messages, busy metrics). Per micro-batch the
driver makes one call per stage, each taking the previous call's ref: Ray runs a stage's call
once its input is ready, and the driver never waits, so with several of the target's slots in
flight the stages work on different micro-batches at once.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import ray

from pipeline.runtime.ray_start import Placement, start_actor
from pipeline.workers.stage_worker import TargetStageWorker


def start_stages(placement: Callable[[int], Placement], stages: int, **kwargs: Any) -> list[Any]:
    """The ``stages`` actors of one target; stage s in bundle ``placement(s)``."""
    return [start_actor(TargetStageWorker, placement(s), stage=s, num_stages=stages, **kwargs)
            for s in range(stages)]


def connect_stages(chains: Sequence[Sequence[Any]]) -> None:
    """Each stage opens its upstream's activation ring and its target's tap ring, once."""
    calls = []
    for chain in chains:
        if len(chain) < 2:
            continue
        taps = chain[-1].ring_handle.remote()
        acts = [stage.act_handle.remote() for stage in chain[:-1]]
        for s, stage in enumerate(chain):
            calls.append(stage.connect.remote(acts[s - 1] if s else None, taps))
    ray.get(calls)


def produce_chain(chain: Sequence[Any], slot: int, batch_ref: Any) -> Any:
    """The ref of the last stage's SlotReady for ``batch_ref`` in tap slot ``slot``."""
    ref: Optional[Any] = None
    for stage in chain:
        ref = stage.produce.remote(slot, batch_ref) if ref is None else \
            stage.produce.remote(slot, batch_ref, ref)
    return ref


def chain_names(chains: Sequence[Sequence[Any]], nodes: Sequence[int]) -> dict[str, str]:
    """Actor id (hex) -> "target 0 stage 1 (node 0)" for every stage of a staged target."""
    return {h._actor_id.hex(): f"target {t} stage {s} (node {nodes[t]})"
            for t, chain in enumerate(chains) if len(chain) > 1
            for s, h in enumerate(chain)}
