"""Where ``ray.remote`` is applied: placement groups per node, and the actors in them.

Each node gets one placement group (STRICT_PACK) holding its targets and drafters, so the
slot rings of a node are opened only by drafters of that node (CUDA IPC and shared memory do
not cross nodes). Groups are sorted by node id, so ranks are node-contiguous.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from pipeline.config import ClusterConfig
from pipeline.ray_start import actor_env

log = logging.getLogger(__name__)


def check_cluster(cfg: ClusterConfig, device: str) -> None:
    """Stop before any actor starts when the cluster cannot hold the requested layout."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) < cfg.num_nodes:
        raise ValueError(f"cluster.num_nodes={cfg.num_nodes} but the Ray cluster has "
                         f"{len(nodes)} live node(s): allowed 1..{len(nodes)}")
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


@dataclass
class NodeGroup:
    node_id: str
    pg: Any  # PlacementGroup


def node_groups(cfg: ClusterConfig, device: str, timeout_s: float = 300.0) -> list[NodeGroup]:
    per_node = cfg.targets_per_node + cfg.drafters_per_node
    bundle = {"CPU": cfg.cpus_per_actor}
    if device == "cuda":
        bundle["GPU"] = cfg.gpus_per_actor
    groups = []
    for _ in range(cfg.num_nodes):
        pg = placement_group([dict(bundle) for _ in range(per_node)],
                             strategy=cfg.placement_strategy)
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
        if not ready:
            raise RuntimeError(f"placement group of {per_node} x {bundle} was not scheduled in "
                               f"{timeout_s:.0f}s: check cluster.* against `ray status`")
        nodes = set(placement_group_table(pg)["bundles_to_node_id"].values())
        groups.append(NodeGroup(node_id=sorted(nodes)[0], pg=pg))
    return sorted(groups, key=lambda g: g.node_id)


def start_actor(cls: type, group: NodeGroup | None, bundle: int, device: str,
                cpus: float, *args: Any, gpus: float = 1.0) -> Any:
    """A plain actor (no concurrency options: its methods run on the main thread)."""
    options: dict[str, Any] = {"num_cpus": cpus, "runtime_env": {"env_vars": actor_env()}}
    if group is not None:
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=group.pg, placement_group_bundle_index=bundle)
        if device == "cuda":
            options["num_gpus"] = gpus
    return ray.remote(cls).options(**options).remote(*args)
