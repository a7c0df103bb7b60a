"""Placement groups per node, and the checks that the cluster can hold them.

Each node gets one placement group (STRICT_PACK) holding its targets and drafters, so the
slot rings of a node are opened only by drafters of that node (CUDA IPC and shared memory do
not cross nodes). Groups are sorted by node id, so ranks are node-contiguous.

Before any actor starts, the cluster's live nodes decide the device (``cluster.device=auto``)
and :func:`check_cluster` refuses layouts that cannot work there: on CUDA, actors that do not
pack onto whole GPUs, and two drafters that may share one.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Sequence

import ray
from ray.util.placement_group import (placement_group, placement_group_table,
                                       remove_placement_group)

from pipeline.job.config import ClusterConfig
from pipeline.eval.config import EvalConfig
from pipeline.runtime.actor_pool import keep_groups, kept_groups
from pipeline.driver.placement import actor_bundle, resources_text, wait_placed
from pipeline.runtime.ray_start import Placement
from pipeline.job.resolve import cluster_device

log = logging.getLogger(__name__)

# Ray keeps resources in fixed point (1e-4): a GPU holding exactly 1.0 (2 x 0.5) is full, not over.
_EPS = 1e-6


def live_nodes() -> list[dict[str, float]]:
    """The resources of every live node of the Ray cluster this process is connected to."""
    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def check_cluster(cfg: ClusterConfig, eval_cfg: EvalConfig, stages: int = 1) -> str:
    """The device the actors use, decided from the cluster's live nodes (not this host).

    Stops before any actor starts when the cluster cannot hold the requested layout
    (``stages``: actors per target, target.stages).
    """
    nodes = live_nodes()
    device = cluster_device(cfg.device, nodes)
    if len(nodes) < cfg.num_nodes:
        raise ValueError(f"cluster.num_nodes={cfg.num_nodes} but the Ray cluster has "
                         f"{len(nodes)} live node(s): allowed 1..{len(nodes)}")
    if cfg.placement_strategy != "STRICT_PACK" and len(nodes) > 1:
        raise ValueError(
            f"cluster.placement_strategy={cfg.placement_strategy!r} may split a node's group "
            f"of {cfg.bundles_per_node(stages)} actors across the {len(nodes)} nodes of this "
            f"cluster, "
            f"and a target's slot ring cannot be read from another node: allowed on a "
            f"multi-node cluster: 'STRICT_PACK'")
    if device == "cuda":
        check_gpu_layout(cfg, eval_cfg, [int(n.get("GPU", 0) + _EPS) for n in nodes], stages)
    return device


def check_gpu_layout(cfg: ClusterConfig, eval_cfg: EvalConfig, node_gpus: Sequence[int],
                     stages: int = 1) -> None:
    """ValueError unless the layout is safe on nodes with these (whole) GPU counts, on CUDA.

    Pure, so it is tested without Ray or GPUs. Two rules: no two drafters can ever share a
    GPU (NCCL refuses that at the first all-reduce, minutes into the job), and every node's
    group plus the evaluator pack onto whole GPUs.
    """
    _check_drafters_apart(cfg, node_gpus, stages)
    _check_packing(cfg, evaluator_gpus(eval_cfg), node_gpus, stages)


def evaluator_gpus(eval_cfg: EvalConfig) -> float:
    """The GPU fraction the tau evaluator takes, 0 when eval is off (no evaluator starts)."""
    on = eval_cfg.every >= 0 and eval_cfg.prompts > 0  # as TauEvaluator.enabled
    return eval_cfg.gpus if on else 0.0


def actors_per_gpu(gpus_per_actor: float) -> int:
    return int(1 / gpus_per_actor + _EPS)


def _check_drafters_apart(cfg: ClusterConfig, node_gpus: Sequence[int], stages: int) -> None:
    """Refuse a layout in which Ray may put two drafters (NCCL ranks) on one GPU.

    Ray picks the physical GPU of each fractional bundle itself, so whenever two bundles fit on
    one GPU (gpus_per_actor <= 0.5) nothing keeps two drafters apart: not when a node's group
    holds two drafters, nor when two nodes' groups can land on one node. Above 0.5 every
    bundle has a GPU of its own, whatever Ray picks (node8: 8 x 0.875, the evaluator beside).
    """
    f = cfg.gpus_per_actor
    if actors_per_gpu(f) < 2:
        return
    why = (f"cluster.gpus_per_actor={f:g} lets {actors_per_gpu(f)} actors share a GPU, and Ray "
           f"picks which GPU each gets, so two drafters (NCCL ranks) may land on one, which "
           f"NCCL refuses at the first step ('Duplicate GPU detected')")
    if cfg.drafters_per_node > 1:
        raise ValueError(
            f"cluster.drafters_per_node={cfg.drafters_per_node} is not allowed with {why}: "
            f"allowed: cluster.gpus_per_actor > 0.5 (e.g. 1: a GPU per actor), or "
            f"cluster.drafters_per_node=1 (cluster=one_gpu: 1 target + 1 drafter on a GPU)")
    two_groups = [cfg.gpus_per_actor] * (2 * cfg.bundles_per_node(stages))
    if cfg.num_nodes > 1 and any(_packs(two_groups, g) for g in node_gpus):
        raise ValueError(
            f"cluster.num_nodes={cfg.num_nodes} is not allowed with {why}, and a node of this "
            f"cluster (GPUs per live node: {list(node_gpus)}) can hold two nodes' groups: "
            f"allowed: cluster.gpus_per_actor > 0.5, or cluster.num_nodes=1")


def _check_packing(cfg: ClusterConfig, evaluator: float, node_gpus: Sequence[int],
                   stages: int) -> None:
    """Refuse a layout whose actors do not pack onto whole GPUs (a fraction never spans two).

    Summing fractions is not enough: 3 actors at 0.6 need 1.8 GPUs but do not fit on 2.
    """
    per_node = cfg.bundles_per_node(stages)
    if _layout_fits(per_node, cfg.gpus_per_actor, cfg.num_nodes, evaluator, node_gpus):
        return
    most = max((n for n in range(1, per_node) if _layout_fits(
        n, cfg.gpus_per_actor, cfg.num_nodes, evaluator, node_gpus)), default=0)
    allowed = (f"at most {most} actors per node at this fraction" if most >= 2 else
               "not even a target and a drafter per node at this fraction")
    evaluating = (f" and the tau evaluator (train.eval.gpus={evaluator:g}, on any GPU with "
                  f"room; train.eval.every=-1 turns it off)" if evaluator else "")
    staged = f" x target.stages={stages}" if stages > 1 else ""
    raise ValueError(
        f"cluster.targets_per_node={cfg.targets_per_node}{staged} + cluster.drafters_per_node="
        f"{cfg.drafters_per_node} actors at cluster.gpus_per_actor={cfg.gpus_per_actor:g} GPU "
        f"each on cluster.num_nodes={cfg.num_nodes} node(s){evaluating} do not pack onto "
        f"whole GPUs: the live nodes have {list(node_gpus)} GPUs, a GPU holds "
        f"{actors_per_gpu(cfg.gpus_per_actor)} such actor(s) and no actor spans two GPUs. "
        f"Allowed here: {allowed}; or a smaller cluster.gpus_per_actor (cluster=one_gpu "
        f"shares one GPU)")


def _layout_fits(per_node: int, gpus_per_actor: float, num_nodes: int, evaluator: float,
                 node_gpus: Sequence[int]) -> bool:
    """Whether ``num_nodes`` distinct nodes each hold a group, and one GPU the evaluator.

    The evaluator sits beside a group on a node with room, or alone on a GPU node that holds
    no group.
    """
    group = [gpus_per_actor] * per_node
    hosts = [g for g in node_gpus if _packs(group, g)]
    if len(hosts) < num_nodes:
        return False
    if not evaluator:
        return True
    spare_node = sum(1 for g in node_gpus if g >= 1) > num_nodes
    return spare_node or any(_packs(group + [evaluator], g) for g in hosts)


def _packs(fractions: Sequence[float], gpus: int) -> bool:
    """Whether ``fractions`` fit onto ``gpus`` GPUs of capacity 1, none split across two.

    First fit decreasing: exact for what is packed here (equal bundles and one evaluator).
    """
    free = [1.0] * gpus
    for need in sorted(fractions, reverse=True):
        gpu = next((i for i, room in enumerate(free) if room + _EPS >= need), None)
        if gpu is None:
            return False
        free[gpu] -= need
    return True


@dataclass(frozen=True)
class NodeGroup:
    node_id: str
    pg: Any  # PlacementGroup
    cpus: float  # per bundle
    gpus: float  # per bundle; 0 on CPU

    def placement(self, bundle: int) -> Placement:
        return Placement(cpus=self.cpus, gpus=self.gpus, group=self.pg, bundle=bundle)


def node_groups(cfg: ClusterConfig, device: str, stages: int = 1) -> list[NodeGroup]:
    """One STRICT_PACK group per node, sorted by node id; none is left behind on failure.

    Bundles: each target's ``stages`` (target i, stage s at ``i * stages + s``), then the
    drafters. Each group waits up to ``cluster.placement_timeout_s`` for room
    (:func:`placement.wait_placed`: what it waits for, every 30 s)."""
    per_node = cfg.bundles_per_node(stages)
    bundle = actor_bundle(cfg, device)
    kept = kept_groups(_spec(cfg, device, stages))
    if kept is not None:
        return kept
    groups: list[NodeGroup] = []
    try:
        for _ in range(cfg.num_nodes):
            pg = placement_group([dict(bundle) for _ in range(per_node)],
                                 strategy=cfg.placement_strategy)
            groups.append(NodeGroup(node_id="", pg=pg, cpus=cfg.cpus_per_actor,
                                    gpus=bundle.get("GPU", 0.0)))
            wait_placed(pg.ready(), f"node {len(groups) - 1}'s placement group ({per_node} x "
                        f"{resources_text(bundle)}) to be placed", cfg.placement_timeout_s)
            nodes = set(placement_group_table(pg)["bundles_to_node_id"].values())
            if len(nodes) != 1:  # check_cluster refuses the layouts that allow this
                raise RuntimeError(f"placement group {len(groups) - 1} spans nodes "
                                   f"{sorted(nodes)}: its rings would cross nodes")
            groups[-1] = dataclasses.replace(groups[-1], node_id=nodes.pop())
    except BaseException:
        remove_groups(groups)
        raise
    return sorted(groups, key=lambda g: g.node_id)


def _spec(cfg: ClusterConfig, device: str, stages: int) -> tuple:
    """What makes a job's placement groups fit another job (kept actors)."""
    return (cfg.num_nodes, cfg.bundles_per_node(stages),
            tuple(sorted(actor_bundle(cfg, device).items())), cfg.placement_strategy)


def remove_groups(groups: list[NodeGroup]) -> None:
    for group in groups:
        remove_placement_group(group.pg)


def release_groups(groups: list[NodeGroup], cfg: ClusterConfig, device: str,
                   stages: int) -> None:
    """A cleanly closed job's groups: kept for the next job where actors are kept, else
    removed."""
    if not groups or not keep_groups(_spec(cfg, device, stages), groups):
        remove_groups(groups)
