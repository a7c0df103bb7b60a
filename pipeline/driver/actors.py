"""The job's actor set: a prefetcher, and per node its targets and drafters, wired together."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import ray

from pipeline.config import JobConfig
from pipeline.driver.launcher import NodeGroup, node_groups, start_actor
from pipeline.resolve import ResolvedJob
from pipeline.workers.drafter_worker import DrafterWorker
from pipeline.workers.prefetcher import PlanSummary
from pipeline.workers.target_worker import TargetWorker

log = logging.getLogger(__name__)


@dataclass
class Actors:
    prefetcher: Any
    targets: list[Any]
    drafters: list[Any]
    target_node: list[int]
    drafter_node: list[int]
    groups: list[NodeGroup]


def start_actors(job: JobConfig, r: ResolvedJob, plan: PlanSummary, actors: Actors) -> None:
    """Targets and drafters in their nodes' placement groups, recorded into ``actors``."""
    c, d = job.cluster, job.data
    slot_numel = d.micro_batch_size * d.max_length * r.spec.feature_size
    actors.groups = groups = node_groups(c, r.device)
    targets, drafters = actors.targets, actors.drafters
    target_node, drafter_node = actors.target_node, actors.drafter_node
    world = c.num_drafters
    for n, group in enumerate(groups):
        for i in range(c.targets_per_node):
            rank = len(targets)
            targets.append(start_actor(TargetWorker, group, i, r.device, c.cpus_per_actor,
                                       rank, r.target_path, r.spec.target_layer_ids, r.device,
                                       r.target_dtype, c.num_slots, slot_numel, group.node_id,
                                       gpus=c.gpus_per_actor))
            target_node.append(n)
        for i in range(c.drafters_per_node):
            drafters.append(start_actor(
                DrafterWorker, group, c.targets_per_node + i, r.device, c.cpus_per_actor,
                len(drafters), world, r.spec, job.drafter, job.train, r.target_path, r.device,
                r.autocast_dtype, r.target_dtype, slot_numel, plan.end_step,
                gpus=c.gpus_per_actor))
            drafter_node.append(n)


def shutdown(actors: Actors) -> None:
    """Close rings (readers first), kill this job's actors, free its placement groups.

    Closing before killing matters on CPU: a killed owner leaves its /dev/shm segment behind.
    """
    from ray.util.placement_group import remove_placement_group

    for group in (actors.drafters, actors.targets):
        try:
            ray.get([h.close.remote() for h in group], timeout=60)
        except Exception as exc:  # a crashed actor must not hide the original error
            log.warning("closing actors failed: %s", exc)
    for handle in [actors.prefetcher, *actors.targets, *actors.drafters]:
        if handle is not None:
            ray.kill(handle)
    for group in actors.groups:
        remove_placement_group(group.pg)


def connect(actors: Actors) -> None:
    """Form the drafters' process group and open every ring in the drafters of its node."""
    master = ray.get(actors.drafters[0].master_address.remote())
    ray.get([d.init_group.remote(master.addr, master.port) for d in actors.drafters])
    handles = ray.get([t.ring_handle.remote() for t in actors.targets])
    ray.get([d.attach.remote([h for h, n in zip(handles, actors.target_node)
                              if n == actors.drafter_node[i]])
             for i, d in enumerate(actors.drafters)])
