"""Placement groups per node, and the check that the cluster can hold them.

Each node gets one placement group (STRICT_PACK) holding its targets and drafters, so the
slot rings of a node are opened only by drafters of that node (CUDA IPC and shared memory do
not cross nodes). Groups are sorted by node id, so ranks are node-contiguous.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import (placement_group, placement_group_table,
                                       remove_placement_group)

from pipeline.config import ClusterConfig
from pipeline.ray_start import Placement

log = logging.getLogger(__name__)


def check_cluster(cfg: ClusterConfig, device: str) -> None:
    """Stop before any actor starts when the cluster cannot hold the requested layout."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) < cfg.num_nodes:
        raise ValueError(f"cluster.num_nodes={cfg.num_nodes} but the Ray cluster has "
                         f"{len(nodes)} live node(s): allowed 1..{len(nodes)}")
    if cfg.placement_strategy != "STRICT_PACK" and len(nodes) > 1:
        per_node = cfg.targets_per_node + cfg.drafters_per_node
        raise ValueError(
            f"cluster.placement_strategy={cfg.placement_strategy!r} may split a node's group "
            f"of {per_node} actors across the {len(nodes)} nodes of this cluster, and a "
            f"target's slot ring cannot be read from another node: allowed on a multi-node "
            f"cluster: 'STRICT_PACK'")
    if device == "cuda":
        need = cfg.gpus_per_node
        gpus = sorted((int(n["Resources"].get("GPU", 0)) for n in nodes), reverse=True)
        usable = sum(1 for g in gpus if g + 1e-9 >= need)
        if usable < cfg.num_nodes:
            raise ValueError(
                f"(cluster.targets_per_node + cluster.drafters_per_node) x "
                f"cluster.gpus_per_actor = {need:g} GPUs per node on {cfg.num_nodes} node(s), "
                f"but the nodes have {gpus} GPUs: use fewer actors per node, or a fraction "
                f"(cluster=one_gpu shares one GPU)")


@dataclass(frozen=True)
class NodeGroup:
    node_id: str
    pg: Any  # PlacementGroup
    cpus: float  # per bundle
    gpus: float  # per bundle; 0 on CPU

    def placement(self, bundle: int) -> Placement:
        return Placement(cpus=self.cpus, gpus=self.gpus, group=self.pg, bundle=bundle)


def node_groups(cfg: ClusterConfig, device: str, timeout_s: float = 300.0) -> list[NodeGroup]:
    """One STRICT_PACK group per node, sorted by node id; none is left behind on failure."""
    per_node = cfg.targets_per_node + cfg.drafters_per_node
    bundle = {"CPU": cfg.cpus_per_actor}
    if device == "cuda":
        bundle["GPU"] = cfg.gpus_per_actor
    groups: list[NodeGroup] = []
    try:
        for _ in range(cfg.num_nodes):
            pg = placement_group([dict(bundle) for _ in range(per_node)],
                                 strategy=cfg.placement_strategy)
            groups.append(NodeGroup(node_id="", pg=pg, cpus=cfg.cpus_per_actor,
                                    gpus=bundle.get("GPU", 0.0)))
            ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
            if not ready:
                raise RuntimeError(f"placement group of {per_node} x {bundle} was not scheduled "
                                   f"in {timeout_s:.0f}s: check cluster.* against `ray status`")
            nodes = set(placement_group_table(pg)["bundles_to_node_id"].values())
            if len(nodes) != 1:  # check_cluster refuses the layouts that allow this
                raise RuntimeError(f"placement group {len(groups) - 1} spans nodes "
                                   f"{sorted(nodes)}: its rings would cross nodes")
            groups[-1] = dataclasses.replace(groups[-1], node_id=nodes.pop())
    except BaseException:
        remove_groups(groups)
        raise
    return sorted(groups, key=lambda g: g.node_id)


def remove_groups(groups: list[NodeGroup]) -> None:
    for group in groups:
        remove_placement_group(group.pg)
