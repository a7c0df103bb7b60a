"""Targets vs drafters per node, or a target and a drafter per GPU, chosen from per-role rates.

With ``cluster.layout=auto`` the driver picks ``targets_per_node``, ``drafters_per_node`` and
``gpus_per_actor`` before any actor starts, from two figures: ``r_t`` and ``r_d``, the
samples/s of one target and of one drafter alone on a GPU at the job's shape. For a node of
``G`` GPUs it predicts:

* split, ``T`` targets + ``D`` drafters on whole GPUs (``T + D = G``, both >= 1)::

      rate = min(T * r_t, D * r_d)        # the slower role bounds; the other idles

* co-located, each GPU holding one target and one drafter that share its time::

      rate = G / (1 / r_t + 1 / r_d)      # a sample costs 1/r_t + 1/r_d GPU-seconds

and takes the highest predicted rate among the layouts ``launcher.check_gpu_layout`` accepts
on ``G`` GPUs with the tau evaluator's fraction (ties: fewer targets). So co-location is
chosen only where the launcher can keep drafters on distinct GPUs: today on one-GPU nodes
(``cluster=one_gpu``); on larger nodes it is predicted and reported, not chosen. Split
layouts get ``gpus_per_actor = 1 - train.eval.gpus`` (the evaluator beside any actor; 1 with
eval off), co-located ones ``(1 - train.eval.gpus) / 2``. The chosen layout replaces those
fields of the ClusterConfig (``dataclasses.replace``, ``layout="manual"``), so everything
downstream sees a plain manual layout. Note that the drafter count sets the samples per step
(drafters x grad_accum x micro-batch).

What the model leaves out: slot copies (over 1 TB/s on a GPU), the gradient all-reduce, the
evaluator's share (it runs every ``train.eval.every`` steps) and the little overlap of target
and drafter kernels on a shared GPU (one H200 measured 11.8 where 11.4 was predicted).

Rates are not measured here (no warm-up run): they come from ``cluster.rates`` in the config,
or from a profile JSON (``cluster.rates.profile``) that a benchmark writes with
:func:`write_profile`::

    {"target_samples_per_s": 11.2, "drafter_samples_per_s": 7.0,
     "max_length": 3072, "micro_batch_size": 2}

``max_length``/``micro_batch_size`` (optional) name the shape of the measurement; a job of
another shape gets a warning, since rates change with the shape. :func:`predict_node_rate`
gives the rate of the layout chosen for an 8-GPU node from the two figures, for benchmarks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from pipeline.job.config import ClusterConfig, JobConfig, RatesConfig
from pipeline.driver.launcher import check_gpu_layout, evaluator_gpus, live_nodes
from pipeline.eval.config import EvalConfig
from pipeline.job.resolve import cluster_device

log = logging.getLogger(__name__)

_RATE_KEYS = ("target_samples_per_s", "drafter_samples_per_s")
_SHAPE_KEYS = ("max_length", "micro_batch_size")


@dataclass(frozen=True)
class Rates:
    """Samples/s of one target and one drafter alone on a GPU, and the shape measured at."""

    target_samples_per_s: float
    drafter_samples_per_s: float
    max_length: Optional[int] = None
    micro_batch_size: Optional[int] = None
    source: str = "config"

    def __post_init__(self) -> None:
        for key in _RATE_KEYS:
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{self.source}: {key}={value!r} is not allowed: expected a "
                                 f"finite rate > 0 samples/s")


@dataclass(frozen=True)
class Layout:
    """One node's layout and its predicted rate (samples/s of the whole node)."""

    colocated: bool
    gpus: int
    targets: int
    drafters: int
    gpus_per_actor: float
    samples_per_s: float
    # split: "target" or "drafter" (the slower role), or "balanced"; co-located: "shared".
    bound: str
    idle: float  # split: the other role's idle fraction; co-located: 0
    target_share: float  # co-located: the target's share of each GPU's time; split: 0
    refused: Optional[str] = None  # why launcher.check_gpu_layout refuses it, if it does
    stages: int = 1  # actors (GPUs, split) per target: target.stages

    def describe(self) -> str:
        if self.colocated:
            return (f"{self.gpus} x (1 target + 1 drafter) co-located, "
                    f"gpus_per_actor={self.gpus_per_actor:g}")
        staged = f" x {self.stages} stages" if self.stages > 1 else ""
        return (f"{self.targets} target{'s' * (self.targets > 1)}{staged} + {self.drafters} "
                f"drafter{'s' * (self.drafters > 1)}, gpus_per_actor={self.gpus_per_actor:g}")

    def bound_text(self) -> str:
        if self.colocated:
            return (f"GPU time shared: target {self.target_share:.0%}, "
                    f"drafter {1 - self.target_share:.0%}")
        if self.bound == "balanced":
            return "balanced (neither role idles)"
        other = "drafters" if self.bound == "target" else "targets"
        return f"{self.bound}-bound ({other} idle {self.idle:.0%})"


@dataclass(frozen=True)
class LayoutChoice:
    chosen: Layout
    runner_up: Optional[Layout]
    candidates: tuple[Layout, ...]  # every layout considered, best first, refused ones too
    rates: Rates

    @property
    def better_refused(self) -> Optional[Layout]:
        """The best layout the launcher refuses, when it predicts more than the chosen one."""
        best = self.candidates[0]
        return best if best.refused and best.samples_per_s > self.chosen.samples_per_s else None

    def log_line(self) -> str:
        c, r = self.chosen, self.rates
        line = (f"cluster.layout=auto on {c.gpus} GPU{'s' * (c.gpus > 1)} per node: "
                f"{c.describe()}, predicted "
                f"{c.samples_per_s:.1f} samples/s per node, {c.bound_text()}")
        if self.runner_up is not None:
            u = self.runner_up
            line += (f"; runner-up {u.describe()} at {u.samples_per_s:.1f} samples/s, "
                     f"{u.bound_text()}")
        refused = self.better_refused
        if refused is not None:
            why = re.split(r", and |: ", refused.refused or "")[0]
            line += (f"; not allowed by launcher.check_gpu_layout: {refused.describe()} at "
                     f"{refused.samples_per_s:.1f} samples/s ({why})")
        return line + f"; rates {_rates_text(r)}"


def colocated_rate(gpus: int, rates: Rates) -> float:
    """Node samples/s of ``gpus`` GPUs, each shared by one target and one drafter."""
    return gpus / (1 / rates.target_samples_per_s + 1 / rates.drafter_samples_per_s)


def _split(targets: int, drafters: int, rates: Rates, fraction: float,
           stages: int = 1) -> Layout:
    t = targets * rates.target_samples_per_s
    d = drafters * rates.drafter_samples_per_s
    rate = min(t, d)
    if math.isclose(t, d, rel_tol=1e-9):
        bound, idle = "balanced", 0.0
    else:
        bound, idle = ("target", 1 - t / d) if t < d else ("drafter", 1 - d / t)
    return Layout(False, targets * stages + drafters, targets, drafters, fraction, rate, bound,
                  idle, 0.0, stages=stages)


def _colocated(gpus: int, rates: Rates, fraction: float) -> Layout:
    rt, rd = rates.target_samples_per_s, rates.drafter_samples_per_s
    return Layout(True, gpus, gpus, gpus, fraction, colocated_rate(gpus, rates), "shared", 0.0,
                  rd / (rt + rd))


def _floor_fraction(x: float) -> float:
    """Down to Ray's resource precision (1e-4), so the fractions of a GPU never exceed 1."""
    return math.floor(x * 1e4 + 1e-6) / 1e4


def _refusal(layout: Layout, eval_cfg: EvalConfig, num_nodes: int) -> Optional[str]:
    """The launcher's reason to refuse ``layout`` on nodes of ``layout.gpus`` GPUs, or None."""
    if not layout.colocated and layout.gpus_per_actor <= 0.5:  # Ray could pair two on a GPU
        return (f"a split needs over half a GPU per actor, and train.eval.gpus="
                f"{eval_cfg.gpus:g} leaves {layout.gpus_per_actor:g}")
    if layout.gpus_per_actor <= 0:
        return f"no GPU fraction left beside train.eval.gpus={eval_cfg.gpus:g}"
    cluster = ClusterConfig(device="cuda", num_nodes=num_nodes, targets_per_node=layout.targets,
                            drafters_per_node=layout.drafters,
                            gpus_per_actor=layout.gpus_per_actor)
    try:
        check_gpu_layout(cluster, eval_cfg, [layout.gpus] * num_nodes, layout.stages)
    except ValueError as err:
        return str(err).split(": allowed")[0].split(". Allowed")[0]
    return None


def candidates(rates: Rates, gpus: int, eval_cfg: EvalConfig, num_nodes: int = 1,
               stages: int = 1) -> list[Layout]:
    """Every split and the co-located layout of a ``gpus``-GPU node, best predicted first.

    A target of ``stages`` stages takes ``stages`` GPUs of a split (its rate, in ``rates``,
    is that of the whole chain); co-location (one target and one drafter per GPU) is a
    layout of unstaged targets only.
    """
    if gpus < 1:
        raise ValueError(f"cluster.layout=auto needs GPUs: a node has {gpus}")
    e = evaluator_gpus(eval_cfg)
    layouts = [_split(t, gpus - t * stages, rates, _floor_fraction(1 - e), stages)
               for t in range(1, (gpus - 1) // stages + 1)]
    if stages == 1:
        layouts.append(_colocated(gpus, rates, _floor_fraction((1 - e) / 2)))
    layouts = [dataclasses.replace(x, refused=_refusal(x, eval_cfg, num_nodes)) for x in layouts]
    # Highest rate first; ties (to 1e-6 samples/s): fewer targets, then split before co-located.
    return sorted(layouts, key=lambda x: (-round(x.samples_per_s, 6), x.targets, x.colocated))


def choose_layout(rates: Rates, gpus: int, eval_cfg: EvalConfig,
                  num_nodes: int = 1, stages: int = 1) -> LayoutChoice:
    """The allowed layout of highest predicted rate on a node of ``gpus`` GPUs (pure)."""
    ranked = candidates(rates, gpus, eval_cfg, num_nodes, stages)
    allowed = [x for x in ranked if x.refused is None]
    if not ranked:
        fewer = f"target.stages <= {gpus - 1}, or " if gpus >= 2 else ""
        raise ValueError(f"cluster.layout=auto found no layout on {gpus} GPU(s) per node for "
                         f"target.stages={stages}: a target takes {stages} GPUs and a drafter "
                         f"one more. Allowed: {fewer}cluster.layout=manual with GPUs shared "
                         f"(cluster.gpus_per_actor)")
    if not allowed:
        reasons = "; ".join(f"{x.describe()}: {x.refused}" for x in ranked)
        raise ValueError(f"cluster.layout=auto found no layout the launcher allows on "
                         f"{gpus} GPU(s) per node with train.eval.gpus={eval_cfg.gpus:g}: "
                         f"{reasons}. Allowed: cluster.layout=manual, or a smaller "
                         f"train.eval.gpus (train.eval.every=-1 turns the evaluator off)")
    return LayoutChoice(allowed[0], allowed[1] if len(allowed) > 1 else None, tuple(ranked),
                        rates)


def predict_node_rate(target_samples_per_s: float, drafter_samples_per_s: float,
                      gpus: int = 8, eval_gpus: Optional[float] = 0.1) -> float:
    """Predicted samples/s of one node of ``gpus`` GPUs (8x H200 by default) in the layout
    ``cluster.layout=auto`` picks there from one target's and one drafter's rate alone on a
    GPU: the best of ``min(T * r_t, D * r_d)`` over ``T + D = gpus`` and, where the launcher
    allows it (one-GPU nodes), ``gpus / (1/r_t + 1/r_d)``. ``eval_gpus``: the tau
    evaluator's GPU fraction (None: eval off).
    """
    rates = Rates(target_samples_per_s, drafter_samples_per_s, source="predict_node_rate")
    eval_cfg = EvalConfig(every=-1) if eval_gpus is None else EvalConfig(gpus=eval_gpus)
    return choose_layout(rates, gpus, eval_cfg).chosen.samples_per_s


def predict_layout(cluster: ClusterConfig, rates: Rates, stages: int = 1) -> Optional[Layout]:
    """The predicted node rate of a manual layout, for the shapes the model covers."""
    t, d = cluster.targets_per_node, cluster.drafters_per_node
    if cluster.gpus_per_actor > 0.5:  # a GPU per actor
        return _split(t, d, rates, cluster.gpus_per_actor, stages)
    # At <= 0.5 the launcher allows this only as a target and a drafter per GPU.
    if t == d and stages == 1:
        return _colocated(t, rates, cluster.gpus_per_actor)
    return None


def apply_layout(cluster: ClusterConfig, layout: Layout) -> ClusterConfig:
    """``cluster`` with the chosen layout's fields, as a plain manual layout."""
    return dataclasses.replace(cluster, layout="manual", targets_per_node=layout.targets,
                               drafters_per_node=layout.drafters,
                               gpus_per_actor=layout.gpus_per_actor)


# -- rates: from the config or a profile ------------------------------------------------------
def load_rates(cfg: RatesConfig) -> Rates:
    """The rates ``cluster.rates`` names: its own figures, or those of its profile file."""
    if cfg.profile is None:
        assert cfg.target_samples_per_s is not None and cfg.drafter_samples_per_s is not None
        return Rates(cfg.target_samples_per_s, cfg.drafter_samples_per_s, cfg.max_length,
                     cfg.micro_batch_size, source="cluster.rates")
    where = f"cluster.rates.profile={cfg.profile!r}"
    try:
        data = json.loads(Path(cfg.profile).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{where} is not allowed: expected a readable JSON profile "
                         f"({type(err).__name__}: {err})") from None
    missing = [k for k in _RATE_KEYS if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"{where} is not allowed: the profile lacks {missing}; expected an "
                         f"object with {list(_RATE_KEYS)} (and optionally {list(_SHAPE_KEYS)})")
    return Rates(*(data[k] for k in _RATE_KEYS), *(data.get(k) for k in _SHAPE_KEYS),
                 source=where)


def write_profile(path: str | Path, rates: Rates, **extra: Any) -> None:
    """Write the profile ``cluster.rates.profile`` reads (``extra``: e.g. machine, date)."""
    record = {k: getattr(rates, k) for k in (*_RATE_KEYS, *_SHAPE_KEYS)}
    Path(path).write_text(json.dumps({**record, **extra}, indent=2) + "\n")


def _rates_text(r: Rates) -> str:
    shape = (f" at {r.max_length} tokens x {r.micro_batch_size}"
             if r.max_length and r.micro_batch_size else "")
    return (f"target {r.target_samples_per_s:g}, drafter {r.drafter_samples_per_s:g} "
            f"samples/s{shape} ({r.source})")


def _warn_on_shape(rates: Rates, max_length: int, micro_batch_size: int) -> None:
    measured = (rates.max_length, rates.micro_batch_size)
    if any(m is not None and m != j for m, j in zip(measured, (max_length, micro_batch_size))):
        log.warning("cluster.rates were measured at data.max_length=%s, data.micro_batch_size="
                    "%s, but this job has %d and %d: the layout's prediction may be off",
                    *measured, max_length, micro_batch_size)


# -- driver glue --------------------------------------------------------------------------------
def node_gpu_count(nodes: Sequence[Mapping[str, float]], num_nodes: int) -> Optional[int]:
    """GPUs per node the layout plans for: the fewest among the ``num_nodes`` largest nodes."""
    counts = sorted((int(n.get("GPU", 0) + 1e-6) for n in nodes), reverse=True)
    return counts[num_nodes - 1] if len(counts) >= num_nodes and counts[num_nodes - 1] else None


def plan_layout(job: JobConfig, nodes: Sequence[Mapping[str, float]]) -> JobConfig:
    """``job`` with cluster.layout=auto resolved for these live nodes' resources (pure).

    Manual layouts come back unchanged (with their predicted rate logged when rates are
    known), and so does every layout on CPU or on a cluster too small for cluster.num_nodes
    (``check_cluster`` reports that).
    """
    c = job.cluster
    if not c.rates.has_source:
        return job
    device = cluster_device(c.device, nodes)
    gpus = node_gpu_count(nodes, c.num_nodes)
    if device != "cuda" or gpus is None:
        if c.layout == "auto":
            log.info("cluster.layout=auto applies on CUDA nodes: keeping cluster.targets_per_"
                     "node=%d, cluster.drafters_per_node=%d", c.targets_per_node,
                     c.drafters_per_node)
        return job
    rates = load_rates(c.rates)
    _warn_on_shape(rates, job.data.max_length, job.data.micro_batch_size)
    stages = job.target.stages
    if c.layout == "manual":
        manual = predict_layout(c, rates, stages)
        if manual is not None and gpus > stages:  # else auto has nothing to compare
            choice = choose_layout(rates, gpus, job.train.eval, c.num_nodes, stages)
            log.info("cluster.layout=manual: %s, predicted %.1f samples/s per node, %s; "
                     "cluster.layout=auto would pick %s at %.1f", manual.describe(),
                     manual.samples_per_s, manual.bound_text(), choice.chosen.describe(),
                     choice.chosen.samples_per_s)
        return job
    choice = choose_layout(rates, gpus, job.train.eval, c.num_nodes, stages)
    log.info("%s", choice.log_line())
    return dataclasses.replace(job, cluster=apply_layout(c, choice.chosen))


def with_live_layout(job: JobConfig) -> JobConfig:
    """:func:`plan_layout` for the Ray cluster this process is connected to."""
    return plan_layout(job, live_nodes())
