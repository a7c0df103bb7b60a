"""The job's typed configuration: one dataclass per config group, registered with Hydra.

Defaults live here and only here; ``conf/*.yaml`` selects and overrides them. The entry points
turn the composed DictConfig into a :class:`JobConfig` once (:func:`to_job_config`), and no
DictConfig travels past them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from pipeline.data.config import DataConfig
from pipeline.eval.config import EvalConfig
from pipeline.model.config import DrafterConfig
from pipeline.training.config import OptimConfig, PlanConfig
from pipeline.checks.config_keys import (composition_line, reject_moved_keys, reject_unknown_keys,
                                  reject_unknown_override)
from pipeline.checks.validate import require, require_choice

__all__ = ["JobConfig", "check_command_line", "reject_moved_keys", "register_configs",
           "to_job_config"]

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"  # the entry points' config_path


@dataclass
class TargetConfig:
    # A local HF folder, or "builtin:tiny" for the embedded demo target (built on first use).
    path: str = "builtin:tiny"
    # auto: bfloat16 on CUDA, float32 on CPU.
    dtype: str = "auto"  # one of "auto", "bfloat16", "float16", "float32"
    # torch.compile the target's forward (default mode; shapes may vary, so no CUDA graphs).
    compile: bool = False
    # Pipeline stages: each target runs as this many actors (a GPU each, or sharing one by
    # cluster.gpus_per_actor), each holding a contiguous slice of its layers; activations
    # pass stage to stage over slot rings. A target too large for its GPU share is refused
    # before any actor starts, naming the stage count that fits (pipeline/driver/memory.py).
    stages: int = 1

    def __post_init__(self) -> None:
        require(bool(self.path), "target.path", self.path, "a local model folder or builtin:tiny")
        require(self.stages >= 1, "target.stages", self.stages, ">= 1 (1: the whole target "
                "in one actor)")
        require_choice("target.dtype", self.dtype, ("auto", "bfloat16", "float16", "float32"))


@dataclass
class RatesConfig:
    """``cluster.rates``: samples/s of one actor of each role alone on a GPU, for layout=auto.

    Either the two figures (and, optionally, the shape they were measured at: a layout chosen
    from another shape's rates is warned about), or ``profile``: a JSON file a benchmark
    wrote holding the same keys (``pipeline.driver.layout.write_profile``). Not both.
    """

    target_samples_per_s: Optional[float] = None
    drafter_samples_per_s: Optional[float] = None
    max_length: Optional[int] = None  # data.max_length the figures were measured at
    micro_batch_size: Optional[int] = None  # data.micro_batch_size they were measured at
    profile: Optional[str] = None

    def __post_init__(self) -> None:
        for key in ("target_samples_per_s", "drafter_samples_per_s", "max_length",
                    "micro_batch_size"):
            value = getattr(self, key)
            require(value is None or value > 0, f"cluster.rates.{key}", value, "> 0 or null")
        pair = (self.target_samples_per_s, self.drafter_samples_per_s)
        if (pair[0] is None) != (pair[1] is None):
            key = "drafter_samples_per_s" if pair[1] is None else "target_samples_per_s"
            require(False, f"cluster.rates.{key}", None, "a rate set together with the other "
                    "role's (target_samples_per_s and drafter_samples_per_s), or "
                    "cluster.rates.profile instead of both")
        require(pair[0] is None or self.profile is None, "cluster.rates.profile", self.profile,
                "null when cluster.rates.target_samples_per_s/drafter_samples_per_s are set "
                "(one source of rates)")

    @property
    def has_source(self) -> bool:
        return self.profile is not None or self.target_samples_per_s is not None


@dataclass
class ClusterConfig:
    # Ray address: null starts (or joins, via RAY_ADDRESS) a local cluster.
    address: Optional[str] = None
    device: str = "auto"  # one of "auto", "cpu", "cuda"
    num_nodes: int = 1
    targets_per_node: int = 1
    drafters_per_node: int = 2
    # Slots in each target's ring: bounds the micro-batches in flight per target.
    num_slots: int = 4
    # CPU cores Ray reserves per actor (a CPU run on a laptop wants fractions).
    cpus_per_actor: float = 1.0
    # GPUs Ray reserves per actor on CUDA. Fractions co-locate actors on one GPU (0.5: a target
    # and a drafter share a device, with CUDA IPC between their processes on it). Ray picks
    # each actor's GPU, so at <= 0.5 (two actors fit on a GPU) a node may hold one drafter
    # only: two drafters on a GPU are refused by NCCL. Each node's actors, and the evaluator
    # (train.eval.gpus), must pack onto its whole GPUs (checked before any actor starts).
    gpus_per_actor: float = 1.0
    # STRICT_PACK keeps each node's group on one node. PACK may split a group across nodes,
    # which slot rings cannot span, so it is refused on a cluster of more than one node.
    placement_strategy: str = "STRICT_PACK"  # one of "STRICT_PACK", "PACK"
    # Seconds any collective (the gradient all-reduce) may wait for the slowest rank before
    # the process group gives up. Nothing slow (tau eval, saves of the other ranks) runs
    # between the ranks' all-reduces any more, so this bounds real stalls only.
    collective_timeout_s: float = 600.0
    # Seconds the job waits for Ray to place an actor or a node's placement group while other
    # jobs hold the resources (logged every 30 s); a job that can never fit is refused at once.
    placement_timeout_s: float = 300.0
    # manual: targets_per_node/drafters_per_node/gpus_per_actor as given. auto (on CUDA): the
    # driver picks them per node from cluster.rates and the live GPUs per node, before any
    # actor starts (pipeline/driver/layout.py); the manual fields stay the CPU layout.
    layout: str = "manual"  # one of "manual", "auto"
    rates: RatesConfig = field(default_factory=RatesConfig)
    # Memory of one GPU, for the check that each target stage fits its share
    # (gpus_per_actor) before any actor starts. null: the driver's own GPU, else the nodes'
    # accelerator type (H100 80, H200 141); unknown: the check is skipped with a warning.
    gpu_memory_gb: Optional[float] = None

    def __post_init__(self) -> None:
        require_choice("cluster.layout", self.layout, ("manual", "auto"))
        require(self.layout == "manual" or self.rates.has_source, "cluster.layout", self.layout,
                "'manual', or cluster.rates.target_samples_per_s and drafter_samples_per_s "
                "(or cluster.rates.profile) set for 'auto'")
        for key in ("num_nodes", "targets_per_node", "drafters_per_node", "num_slots"):
            require(getattr(self, key) >= 1, f"cluster.{key}", getattr(self, key), ">= 1")
        require(self.gpu_memory_gb is None or self.gpu_memory_gb > 0, "cluster.gpu_memory_gb",
                self.gpu_memory_gb, "> 0 GB or null (detected)")
        require(self.collective_timeout_s > 0, "cluster.collective_timeout_s",
                self.collective_timeout_s, "> 0 seconds")
        require(self.placement_timeout_s > 0, "cluster.placement_timeout_s",
                self.placement_timeout_s, "> 0 seconds")
        require(self.cpus_per_actor > 0, "cluster.cpus_per_actor", self.cpus_per_actor, "> 0")
        require(0 < self.gpus_per_actor <= 1, "cluster.gpus_per_actor", self.gpus_per_actor,
                "in (0, 1]: a fraction shares a GPU between actors")
        require_choice("cluster.device", self.device, ("auto", "cpu", "cuda"))
        require_choice("cluster.placement_strategy", self.placement_strategy,
                       ("STRICT_PACK", "PACK"))

    @property
    def num_drafters(self) -> int:
        return self.num_nodes * self.drafters_per_node

    @property
    def num_targets(self) -> int:
        return self.num_nodes * self.targets_per_node

    @property
    def actors_per_node(self) -> int:
        """Targets and drafters of one node (a staged target counts once: see bundles)."""
        return self.targets_per_node + self.drafters_per_node

    def bundles_per_node(self, stages: int = 1) -> int:
        """The bundles of one node's placement group: each target's stages, and drafters."""
        return self.targets_per_node * stages + self.drafters_per_node


@dataclass
class CheckpointConfig:
    """``train.checkpoint``: when to save, and where to resume from."""

    # Save every N steps (0: only at the end).
    every: int = 0
    # "auto": the latest usable checkpoint under out_dir (an incomplete or corrupt one is
    # skipped with a warning), else a fresh start, so a rerun of a command goes on where it
    # stopped; a checkpoint path; or null: start fresh (refused when out_dir holds
    # checkpoints, which the fresh job would overwrite). A resume must keep the settings of
    # pipeline/job/resume_contract.py's FIXED; changes to the others are logged.
    resume: Optional[str] = "auto"
    # Keep only the newest N step folders (0: keep all). Older ones go only after the new
    # one is in place.
    keep_last: int = 0
    # Resume even though the training data's content differs from the checkpoint's (the data
    # cursor then points into other data: samples may be repeated or missed). Only the
    # content: every other setting a resume must keep is refused all the same.
    allow_data_change: bool = False
    # Save when the job ends. false: nothing to resume from afterwards (benchmarks, throwaway
    # runs); the export, taken from the live drafter, still runs. At 8B the save writes
    # 12.6 GB and holds the end of the job ~40 s.
    final: bool = True
    # Files each drafter rank writes at once (DCP's writer threads, one file each; a load
    # reads any number): serialising is CPU-bound at about 0.4-0.9 GB/s a thread, and at 8B
    # rank 0 writes 12.6 GB beside training. 1: one file per rank, written by one thread.
    write_threads: int = 4
    # Drafters started to load a checkpoint (a restart after a lost actor, a resume) read it
    # into host memory while they start up, and the load then copies it into place
    # (pipeline/checkpoint/read_ahead.py). Takes free host memory of twice the checkpoint per
    # drafter (else it is skipped, said in one line). null (default): on under
    # drafter.parallel=replicate, off under fsdp (a rank's shards are known only once its
    # process group is formed), where true is refused. At 8B on the H200 it took a lost
    # drafter's restart from 32.1 s to 20.8 s (docs/BENCHMARKS.md).
    read_ahead: Optional[bool] = None

    def __post_init__(self) -> None:
        require(self.every >= 0, "train.checkpoint.every", self.every, ">= 0 (0: at the end)")
        require(1 <= self.write_threads <= 64, "train.checkpoint.write_threads",
                self.write_threads, "1..64")
        require(self.keep_last >= 0, "train.checkpoint.keep_last", self.keep_last,
                ">= 0 (0: keep all)")


@dataclass
class RecoveryConfig:
    """``train.recovery``: what the driver does when an actor dies or the loss blows up."""

    # Restarts of the actor set (from the last checkpoint) after a lost actor, per job.
    max_restarts: int = 2
    # Non-finite steps in a row (loss or gradient NaN/inf; each one skipped on every rank)
    # after which the job saves its last good state and stops.
    max_nonfinite_in_row: int = 3

    def __post_init__(self) -> None:
        require(self.max_restarts >= 0, "train.recovery.max_restarts", self.max_restarts,
                ">= 0 (0: a lost actor ends the job)")
        require(self.max_nonfinite_in_row >= 1, "train.recovery.max_nonfinite_in_row",
                self.max_nonfinite_in_row, ">= 1")


@dataclass
class TrainConfig:
    """``train``: one section per component, and what the whole job shares."""

    plan: PlanConfig = field(default_factory=PlanConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    seed: int = 0
    # auto: bf16 autocast on CUDA, fp32 on CPU. Master weights are always fp32.
    precision: str = "auto"  # one of "auto", "fp32", "bf16"
    out_dir: str = "runs/default"
    log_every: int = 1
    export_dtype: str = "bfloat16"  # one of "bfloat16", "float16", "float32"

    def __post_init__(self) -> None:
        require(self.log_every >= 1, "train.log_every", self.log_every, ">= 1")
        require_choice("train.precision", self.precision, ("auto", "fp32", "bf16"))
        require_choice("train.export_dtype", self.export_dtype, ("bfloat16", "float16", "float32"))


@dataclass
class LoggerConfig:
    kind: str = "none"  # one of "none", "wandb"
    # null leaves the choice to wandb's own variables (WANDB_PROJECT, WANDB_ENTITY, WANDB_MODE);
    # a project named by neither is "dflash".
    project: Optional[str] = None
    entity: Optional[str] = None
    name: Optional[str] = None
    mode: Optional[str] = None  # null or one of "online", "offline", "disabled"
    # More wandb.init arguments, e.g. +logger.wandb_init.tags=[8b,ablation] or .group=sweep1.
    wandb_init: dict[str, Any] = field(default_factory=dict)
    # Record a Chrome/Perfetto trace of per-actor spans for steps [trace_start, trace_start+n).
    trace_start: int = 2
    trace_steps: int = 5

    def __post_init__(self) -> None:
        require_choice("logger.kind", self.kind, ("none", "wandb"))
        if self.mode is not None:
            require_choice("logger.mode", self.mode, ("online", "offline", "disabled"))


@dataclass
class JobConfig:
    target: TargetConfig = field(default_factory=TargetConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def __post_init__(self) -> None:
        check_across_sections(self)


def register_configs() -> None:
    """Register the schema so conf/config.yaml can name it in its defaults list."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="job_schema", node=JobConfig)


def to_job_config(cfg: Any) -> JobConfig:
    """DictConfig -> JobConfig; runs every section's __post_init__ validation."""
    from omegaconf import OmegaConf

    if isinstance(cfg, JobConfig):
        return cfg
    reject_unknown_keys(cfg, JobConfig)
    obj = OmegaConf.to_object(cfg)
    if not isinstance(obj, JobConfig):
        raise TypeError(f"expected a config composed on job_schema, got {type(obj).__name__}")
    return obj


def check_command_line(argv: Sequence[str], config_name: str = "config") -> None:
    """ValueError, in one line, for the first config mistake of a Hydra entry point's command.

    Run before Hydra's main (so before any run folder, log or Ray): a moved or unknown key
    (with or without '+', naming the nearest), a value of the wrong type, an unknown option of
    a config group or --config-name, an unresolvable interpolation. Hydra's own report of
    these is several lines and exits 1. Values are checked later, in one line as well, by
    :func:`to_job_config`. A command line this cannot judge (--help, --multirun sweeps,
    another --config-path/--config-dir) is left to Hydra.
    """
    parsed = _overrides_of(argv)
    if parsed is not None:
        check_overrides(parsed[0], parsed[1] or config_name)


def check_overrides(overrides: Sequence[str], config_name: str = "config") -> None:
    """Compose ``overrides`` on conf/``config_name`` as the entry points do; ValueError in one
    line for the first key, type, option or interpolation mistake."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    reject_moved_keys(overrides)
    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_override(override)
        except HydraException as e:  # Hydra's own message does not say which override
            why = str(e).strip().splitlines()[0]
            raise ValueError(f"{override!r} is not a valid override ({why}): key=value, "
                             "+key=value or ~key") from None
        reject_unknown_override(override, JobConfig)
    available = sorted(p.stem for p in CONF_DIR.glob("*.yaml"))
    if config_name.removesuffix(".yaml") not in available:
        raise ValueError(f"--config-name {config_name}: no such config in {CONF_DIR}; "
                         f"available: {', '.join(available)}")
    register_configs()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose(config_name, overrides=list(overrides))
        reject_unknown_keys(cfg, JobConfig)  # keys the yaml files add
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ValueError(composition_line(e, overrides, JobConfig)) from None


def _overrides_of(argv: Sequence[str]) -> Optional[tuple[list[str], Optional[str]]]:
    """(overrides, --config-name) of a Hydra entry point's argv, by Hydra's own parser."""
    from hydra._internal.utils import get_args_parser  # the parser hydra.main itself uses

    if any(a in ("-h", "--help", "--hydra-help", "--version", "-sc") or
           a.startswith("--shell-completion") for a in argv):
        return None
    args, _ = get_args_parser().parse_known_args(list(argv))
    if args.multirun or args.config_path or args.config_dir or args.experimental_rerun:
        return None
    return args.overrides, args.config_name


def check_across_sections(job: JobConfig) -> None:
    """Constraints between keys of different sections, checked before anything starts.

    Each would otherwise surface late: a max_length that leaves no sample long enough to
    train drops every sample after the cluster started, and a pack pool smaller than one
    sample's anchors stops the prefetcher.
    """
    from pipeline.data.batching import BatchShapes

    d, data = job.drafter, job.data
    least = 2 * d.block_size  # a sample needs this many supervised tokens (dflash.md)
    require(data.max_length >= least, "data.max_length", data.max_length,
            f">= 2 * drafter.block_size ({least}): a sample needs {least} supervised tokens, "
            f"so a shorter limit drops every sample")
    if data.batching != "pad" and data.buckets is not None:
        low = data.buckets[0]
        require(low >= least, "data.buckets", data.buckets,
                f"buckets of >= 2 * drafter.block_size ({least}) tokens: a {low}-token "
                f"bucket can never hold a sample with {least} supervised tokens")
    BatchShapes.from_config(data, d.static_shapes, d.num_anchors)  # pool vs anchors
    require(not (job.train.checkpoint.read_ahead is True and d.parallel == "fsdp"),
            "train.checkpoint.read_ahead", True, "false or null under drafter.parallel=fsdp (a rank "
            "reads only its shards, known once the process group is formed)")
    require(not (job.train.eval.weights_ring is True and d.parallel == "fsdp"),
            "train.eval.weights_ring", True, "false or null under drafter.parallel=fsdp (the "
            "full weights are gathered to host memory on every rank, not held on one device)")
    # A staged target splits only the layers up to the deepest tap (model/stages.py); the
    # final hidden state distillation reads would need a last stage that runs the rest.
    require(not (d.distills and job.target.stages > 1), "drafter.distill_weight",
            d.distill_weight, "0 with target.stages > 1 (a staged target stops at its deepest "
            "tap and hands over no final hidden state; use target.stages=1 to distil)")


def weights_ring(job: JobConfig) -> Optional[bool]:
    """How the evaluator is handed the weights (train.eval.weights_ring): True, the ring
    always (refused on another node); None, the ring where the evaluator shares drafter rank
    0's node; False, the object store. Under fsdp: False."""
    if job.drafter.parallel == "fsdp":
        return False
    return job.train.eval.weights_ring


def reads_ahead(job: JobConfig) -> bool:
    """Whether drafters read the checkpoint they will load while they start
    (train.checkpoint.read_ahead; null: wherever it applies, i.e. not under fsdp)."""
    chosen = job.train.checkpoint.read_ahead
    return job.drafter.parallel != "fsdp" if chosen is None else chosen
