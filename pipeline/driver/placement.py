"""What the job asks Ray to place, checked against the cluster before any actor starts, and the
waits for what fits but is held by others now.

The launcher asks for (driver/actors.py, driver/evaluator.py, :func:`launcher.node_groups`):

* the prefetcher: ``cluster.cpus_per_actor`` CPUs, on any node;
* the tau evaluator, when eval is on: the same CPUs, and ``train.eval.gpus`` on CUDA;
* per node (``cluster.num_nodes``) one placement group of ``bundles_per_node`` bundles of
  ``{CPU: cluster.cpus_per_actor, GPU: cluster.gpus_per_actor}`` (GPU on CUDA only), all on
  one node (STRICT_PACK).

No actor reserves Ray's ``memory`` resource, so memory is not placed here (a target stage's GPU
memory is checked in driver/memory.py). :func:`check_placement` refuses, in one line, a job
that can never fit the live nodes (one ask larger than every node, or more of a resource in all
than the cluster has): Ray would wait for resources that never come. A job that fits but finds
them held by other jobs waits in :func:`wait_placed`, which says every :data:`LOG_EVERY_S` what
it waits for and what is free, and ends in one line at ``cluster.placement_timeout_s``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import ray

from pipeline.job.config import ClusterConfig
from pipeline.eval.config import EvalConfig
from pipeline.checks.preflight import PreflightError

log = logging.getLogger(__name__)

LOG_EVERY_S = 30.0
# Ray keeps resources in fixed point (1e-4): an ask of exactly what a node has fits.
_EPS = 1e-6


class NotPlaced(PreflightError):
    """Ray found no room for an actor or a placement group within its time-out (one line)."""


@dataclass(frozen=True)
class Ask:
    """Resources Ray must find on one node at once."""

    name: str
    cpus: float
    gpus: float = 0.0

    def text(self) -> str:
        return resources_text({"CPU": self.cpus, "GPU": self.gpus})


def actor_bundle(cfg: ClusterConfig, device: str) -> dict[str, float]:
    """One actor's bundle, as the launcher places it: its CPUs, and its GPUs on CUDA."""
    bundle = {"CPU": cfg.cpus_per_actor}
    if device == "cuda":
        bundle["GPU"] = cfg.gpus_per_actor
    return bundle


def job_asks(cfg: ClusterConfig, eval_cfg: EvalConfig, device: str,
             stages: int = 1) -> list[Ask]:
    """Everything the launcher asks Ray for, one entry per node-sized piece."""
    per_node = cfg.bundles_per_node(stages)
    bundle = actor_bundle(cfg, device)
    gpus = bundle.get("GPU", 0.0)
    asks = [Ask(f"node {n}'s placement group ({per_node} x {resources_text(bundle)}, kept on "
                f"one node)", per_node * bundle["CPU"], per_node * gpus)
            for n in range(cfg.num_nodes)]
    asks.append(Ask("the prefetcher", cfg.cpus_per_actor))
    if eval_cfg.off is None:
        asks.append(Ask("the tau evaluator", cfg.cpus_per_actor,
                        eval_cfg.gpus if device == "cuda" else 0.0))
    return asks


def check_placement(cfg: ClusterConfig, eval_cfg: EvalConfig, device: str,
                    nodes: Sequence[Mapping[str, float]], stages: int = 1) -> None:
    """PreflightError, in one line, when the job's asks can never fit ``nodes`` (the live
    nodes' total resources): an ask no single node holds, or more in all than they hold."""
    asks = job_asks(cfg, eval_cfg, device, stages)
    for ask in asks:
        if not any(_holds(node, ask) for node in nodes):
            raise PreflightError(
                f"the job can never be placed on this Ray cluster: {ask.name} asks "
                f"{ask.text()} on one node, and no live node has that much (nodes: "
                f"{_nodes_text(nodes)}); {_advice(cfg, eval_cfg, device, nodes, stages)}")
    for key, field in (("CPU", "cpus"), ("GPU", "gpus")):
        need = sum(getattr(ask, field) for ask in asks)
        have = sum(node.get(key, 0.0) for node in nodes)
        if need > have + _EPS:
            raise PreflightError(
                f"the job can never be placed on this Ray cluster: it asks {need:g} {key}s in "
                f"all ({_breakdown(cfg, eval_cfg, stages, field)}), and its {len(nodes)} live "
                f"node(s) have {have:g} {key}s; {_advice(cfg, eval_cfg, device, nodes, stages)}")


def _holds(node: Mapping[str, float], ask: Ask) -> bool:
    return (node.get("CPU", 0.0) + _EPS >= ask.cpus
            and node.get("GPU", 0.0) + _EPS >= ask.gpus)


def _breakdown(cfg: ClusterConfig, eval_cfg: EvalConfig, stages: int, field: str) -> str:
    staged = f" x target.stages={stages}" if stages > 1 else ""
    group = (f"{cfg.targets_per_node}{staged} target(s) + {cfg.drafters_per_node} drafter(s) "
             f"on each of cluster.num_nodes={cfg.num_nodes} node(s)")
    if field == "gpus":
        evaluating = f", the tau evaluator at train.eval.gpus={eval_cfg.gpus:g}" \
            if eval_cfg.off is None else ""
        return f"{group} at cluster.gpus_per_actor={cfg.gpus_per_actor:g}{evaluating}"
    actors = cfg.num_nodes * cfg.bundles_per_node(stages) + 1 + (eval_cfg.off is None)
    evaluating = ", the tau evaluator" if eval_cfg.off is None else ""
    return (f"{actors} actors x cluster.cpus_per_actor={cfg.cpus_per_actor:g}: {group}, the "
            f"prefetcher{evaluating}")


def _advice(cfg: ClusterConfig, eval_cfg: EvalConfig, device: str,
            nodes: Sequence[Mapping[str, float]], stages: int) -> str:
    """The keys that make the job fit, with the largest cpus_per_actor that would."""
    fewer = "fewer actors (cluster.drafters_per_node, cluster.targets_per_node" + \
        ("; train.eval.every=-1 leaves the evaluator out)" if eval_cfg.off is None else ")")
    cpus = _largest_cpus_per_actor(cfg, eval_cfg, device, nodes, stages)
    smaller = (f"cluster.cpus_per_actor={cpus:g} or less" if cpus > 0
               else "a smaller cluster.cpus_per_actor")
    start = "--num-cpus N"
    if device == "cuda":
        smaller += ", a smaller cluster.gpus_per_actor or train.eval.gpus"
        start += " --num-gpus N"
    return (f"allowed here: {smaller}, {fewer}, or a Ray cluster with more (`ray start "
            f"{start}`; `ray status` shows what it has)")


def _largest_cpus_per_actor(cfg: ClusterConfig, eval_cfg: EvalConfig, device: str,
                            nodes: Sequence[Mapping[str, float]], stages: int) -> float:
    """The largest cpus_per_actor (to 0.01) that passes :func:`check_placement`'s CPU tests
    with the rest of the job as it is; 0 when none does (the GPUs do not fit)."""
    asks = job_asks(cfg, eval_cfg, device, stages)
    total = sum(n.get("CPU", 0.0) for n in nodes)
    limit = total / sum(a.cpus / cfg.cpus_per_actor for a in asks)
    for ask in asks:  # each ask on its own: the most CPUs a node with its GPUs has
        room = max((n.get("CPU", 0.0) for n in nodes if n.get("GPU", 0.0) + _EPS >= ask.gpus),
                   default=0.0)
        limit = min(limit, room / (ask.cpus / cfg.cpus_per_actor))
    return math.floor(limit * 100 + 1e-6) / 100


def resources_text(resources: Mapping[str, float]) -> str:
    """``{CPU: 0.5, GPU: 1}``: the CPUs and GPUs of ``resources`` (GPUs only where any)."""
    shown = {k: resources.get(k, 0.0) for k in ("CPU", "GPU")
             if k == "CPU" or resources.get(k, 0.0) > 0}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in shown.items()) + "}"


def _nodes_text(nodes: Sequence[Mapping[str, float]]) -> str:
    shown = [resources_text(n) for n in nodes[:4]]
    more = f" and {len(nodes) - 4} more" if len(nodes) > 4 else ""
    return "[" + ", ".join(shown) + "]" + more


def wait_placed(ref: Any, what: str, timeout_s: float, every_s: float = LOG_EVERY_S) -> None:
    """Wait for ``ref`` (a placement group's ``ready()``, an actor's ``__ray_ready__``), saying
    every ``every_s`` what it waits for (``what``: "node 0's placement group ... to be placed")
    and what the cluster has free; :class:`NotPlaced` in one line after ``timeout_s``."""
    start = time.monotonic()
    while True:
        left = timeout_s - (time.monotonic() - start)
        ready, _ = ray.wait([ref], timeout=max(0.0, min(every_s, left)))
        if ready:
            return
        waited = time.monotonic() - start
        free = resources_text(ray.available_resources())
        total = resources_text(ray.cluster_resources())
        if waited >= timeout_s:
            raise NotPlaced(
                f"gave up waiting for {what} after {timeout_s:g}s: the Ray cluster has {free} "
                f"free of {total}, the rest held by other jobs or actors (`ray status`); wait "
                f"longer with cluster.placement_timeout_s, or free them")
        log.warning("waiting %.0fs so far for %s: the Ray cluster has %s free of %s (the rest "
                    "held by other jobs or actors: `ray status`); giving up after "
                    "cluster.placement_timeout_s=%g", waited, what, free, total, timeout_s)
