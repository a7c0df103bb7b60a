"""The resume contract: the settings a checkpoint means something only under.

A checkpoint holds the weights of one drafter shape, trained with one objective on the samples
one tokenizer and chat template made of one data file, and a data cursor (epoch, samples done)
into one sample order. Resuming with any of those settings changed would load into another
shape, or re-plan the epoch so that some samples train twice and others never. Such a resume
is refused before any actor starts, in one line naming each changed key with its old and new
value. Every other setting changes how long, how fast or how visibly training goes on (the
schedule's length, eval, logging, the cluster's shape, checkpoint cadence, optimizer
hyperparameters, precision and kernels), not what the checkpoint means: a change to one of
those is logged, one line each.

The values recorded are the resolved ones (the taps that ``num_taps`` spread, the buckets
``max_length`` implies) and digests of what the paths hold (the training data, the target's
config, weights and tokenizer files), so a moved but identical file resumes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pipeline.checkpoint.files import sha256_file
from pipeline.job.config import JobConfig
from pipeline.model.config import resolve_init_layer_ids
from pipeline.checks.preflight import PreflightError
from pipeline.job.resolve import ResolvedJob

log = logging.getLogger(__name__)

KEY = "contract"
# What checkpoints written before the contract recorded: the training data's digest only.
LEGACY_DATA_KEY = "data_fingerprint"

# Settings that define the drafter's weights or the sample plan: a resume must keep them.
FIXED = frozenset({
    "target.path",  # checked by content: target.config, target.weights, target.tokenizer
    "drafter.num_layers", "drafter.block_size", "drafter.target_layer_ids",
    "drafter.num_taps",  # checked as the taps it resolves to (drafter.target_layer_ids)
    "drafter.mask_token_id", "drafter.num_anchors", "drafter.gamma",
    # The rest of the objective, as gamma: what the weights were trained to minimise.
    "drafter.position_weights", "drafter.dpace_alpha", "drafter.distill_weight",
    "drafter.distill_temperature",
    # The starting weights: a resume under another init would continue from weights that
    # init did not give.
    "drafter.init", "drafter.init_layer_ids",
    "data.train_path",  # checked by content: data.content
    "data.format", "data.max_length", "data.max_line_bytes", "data.micro_batch_size",
    "data.batching", "data.buckets", "data.tokens_per_micro_batch",
    "data.anchors_per_micro_batch", "data.enable_thinking", "data.seed",
    "train.seed",  # the initial weights and every sample's anchors
})

# Settings a resume may change: how long, how fast, how visibly training goes on.
CHANGEABLE = frozenset({
    # Precision and kernels: the same sums, computed another way.
    # target.stages: the same taps, computed by k actors holding a slice of layers each.
    "target.dtype", "target.compile", "target.stages", "drafter.attention", "drafter.compile",
    "drafter.parallel",
    "drafter.loss_chunk_size", "drafter.static_shapes", "train.precision",
    # Held-out prompts are eval only; on_bad_line cannot change the samples of unchanged
    # data (with "error" a bad line had stopped the first run).
    "data.heldout_path", "data.on_bad_line",
    # The cluster: the cursor counts samples, so another layout trains the rest of the epoch
    # once (with other steps: drafters x grad_accum micro-batches each).
    "cluster.address", "cluster.device", "cluster.num_nodes", "cluster.targets_per_node",
    "cluster.drafters_per_node", "cluster.num_slots", "cluster.cpus_per_actor",
    "cluster.gpus_per_actor", "cluster.placement_strategy", "cluster.collective_timeout_s",
    "cluster.placement_timeout_s",
    "cluster.layout", "cluster.rates.target_samples_per_s",
    "cluster.rates.drafter_samples_per_s", "cluster.rates.max_length",
    "cluster.rates.micro_batch_size", "cluster.rates.profile",
    "cluster.gpu_memory_gb",
    # The schedule: its length, and the optimizer's hyperparameters (applied on load).
    "train.plan.epochs", "train.plan.max_steps", "train.plan.stop_at_step",
    "train.plan.grad_accum", "train.optim.lr", "train.optim.warmup_ratio",
    "train.optim.min_lr_ratio", "train.optim.weight_decay", "train.optim.betas",
    "train.optim.grad_clip",
    "train.eval.every", "train.eval.prompts", "train.eval.max_new_tokens", "train.eval.gpus",
    "train.eval.batch_size", "train.eval.cuda_graphs", "train.eval.stream_priority",
    "train.eval.gpu_duty", "train.eval.weights_ring",
    "train.checkpoint.every", "train.checkpoint.resume", "train.checkpoint.keep_last",
    "train.checkpoint.allow_data_change", "train.checkpoint.final",
    "train.checkpoint.write_threads", "train.checkpoint.read_ahead",
    "train.recovery.max_restarts", "train.recovery.max_nonfinite_in_row",
    "train.out_dir", "train.log_every", "train.export_dtype",
    "logger.kind", "logger.project", "logger.entity", "logger.name", "logger.mode",
    "logger.wandb_init", "logger.trace_start", "logger.trace_steps",
})

# Fixed keys recorded as something else than their own config value.
CHECKED_AS = {
    "target.path": ("target.config", "target.weights", "target.tokenizer"),
    "data.train_path": ("data.content",),
    "drafter.num_taps": ("drafter.target_layer_ids",),
}

# Files a tokenizer and its chat template are read from (those present are hashed).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")
# config.json fields that describe the files, not the model.
_FILE_FIELDS = ("_name_or_path", "transformers_version", "dtype", "torch_dtype")
_SAMPLE_BYTES = 1 << 20


def leaves(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a config dataclass by dotted key, as JSON values (tuples become lists)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out.update(leaves(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = json.loads(json.dumps(value))
    return out


def parts_digest(parts: list[bytes]) -> str:
    """sha256 of ``parts``, each prefixed by its length (no two lists hash alike)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def target_config_digest(folder: Path) -> str:
    config = json.loads((folder / "config.json").read_text())
    model = {k: v for k, v in config.items() if k not in _FILE_FIELDS}
    return parts_digest([json.dumps(model, sort_keys=True).encode()])


def target_weights_digest(folder: Path) -> str:
    """Each weight file's name, size, first and last MiB: the whole of an 8B target would take
    a minute to hash; a sample tells another model (or a fine-tune) of the same shape apart."""
    parts = []
    for path in sorted(folder.glob("*.safetensors")):
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(_SAMPLE_BYTES)
            f.seek(max(0, size - _SAMPLE_BYTES))
            tail = f.read()
        parts += [path.name.encode(), str(size).encode(), head, tail]
    return parts_digest(parts)


def file_parts(folder: Path, names: tuple[str, ...]) -> list[bytes]:
    """Name and bytes of each of ``names`` present in ``folder``, for :func:`parts_digest`."""
    parts = []
    for name in names:
        if (folder / name).is_file():
            parts += [name.encode(), (folder / name).read_bytes()]
    return parts


def tokenizer_digest(folder: Path) -> str:
    return parts_digest(file_parts(folder, TOKENIZER_FILES))


BATCHING_KEYS = ("data.micro_batch_size", "data.buckets", "data.tokens_per_micro_batch",
                 "data.anchors_per_micro_batch")


def _batching(job: JobConfig) -> dict[str, Any]:
    """The batching keys the job's mode reads (resolved); the others are recorded as null."""
    data = job.data
    pad = data.batching == "pad"
    return {
        "data.micro_batch_size": data.micro_batch_size if pad else None,
        "data.buckets": None if pad else list(data.resolved_buckets()),
        "data.tokens_per_micro_batch": None if pad else data.resolved_tokens_per_micro_batch(),
        "data.anchors_per_micro_batch": None if pad else data.anchors_per_micro_batch,
    }


_RESOLVED: dict[str, Callable[[JobConfig, ResolvedJob], Any]] = {
    "drafter.target_layer_ids": lambda job, r: list(r.spec.target_layer_ids),
    "drafter.mask_token_id": lambda job, r: r.spec.mask_token_id,
    # Under D-PACE no decay is applied: null, as the job must set it.
    "drafter.gamma": lambda job, r: (job.drafter.resolved_gamma()
                                     if job.drafter.position_weights == "decay" else None),
    "drafter.init_layer_ids": lambda job, r: (
        None if job.drafter.init == "random" else
        resolve_init_layer_ids(job.drafter, int(r.spec.hf_config["num_target_layers"]))),
}


@dataclass(frozen=True)
class Contract:
    fixed: dict[str, Any]       # check name -> value a resume must keep
    changeable: dict[str, Any]  # config key -> value, to log what a resume changed

    @classmethod
    def of(cls, job: JobConfig, r: ResolvedJob) -> "Contract":
        config = leaves(job)
        target = Path(r.target_path)
        fixed = {"target.config": target_config_digest(target),
                 "target.weights": target_weights_digest(target),
                 "target.tokenizer": tokenizer_digest(target),
                 "data.content": sha256_file(Path(r.train_path))}
        batching = _batching(job)
        for key in sorted(FIXED - CHECKED_AS.keys()):
            if key in _RESOLVED:
                fixed[key] = _RESOLVED[key](job, r)
            else:
                fixed[key] = batching[key] if key in batching else config[key]
        return cls(fixed, {k: v for k, v in config.items() if k in CHANGEABLE})

    def record(self) -> dict[str, Any]:
        return {"fixed": self.fixed, "changeable": self.changeable}


def _show(value: Any) -> str:
    if isinstance(value, str) and len(value) == 64 and set(value) <= set("0123456789abcdef"):
        return value[:12]  # a sha256: its head tells two apart
    return json.dumps(value)


def _recorded(state: dict[str, Any], checkpoint: Path) -> dict[str, Any]:
    if KEY in state:
        return state[KEY]
    log.warning("checkpoint %s was written before resumes were checked (its state.json has no "
                "%r): only the training data's content is compared; the model shape, taps, "
                "objective, tokenizer and batching it was trained with are taken on trust",
                checkpoint, KEY)
    data = state.get(LEGACY_DATA_KEY)
    return {"fixed": {} if data is None else {"data.content": data}, "changeable": {}}


def check_resume(state: dict[str, Any], contract: Contract, checkpoint: Path,
                 allow_data_change: bool) -> None:
    """PreflightError naming every fixed setting that changed since ``checkpoint`` was written;
    one log line for each changeable one that did."""
    recorded = _recorded(state, checkpoint)
    old = recorded["fixed"]
    changed = {k: (old[k], v) for k, v in contract.fixed.items() if k in old and old[k] != v}
    if "data.batching" in changed:  # which batching keys are read follows from it
        changed = {k: v for k, v in changed.items() if k not in BATCHING_KEYS}
    if "data.content" in changed and allow_data_change:
        was, now = changed.pop("data.content")
        log.warning("the training data changed since checkpoint %s (content %s then, %s now); "
                    "going on (train.checkpoint.allow_data_change=true): samples of this epoch "
                    "may be repeated or missed", checkpoint, _show(was), _show(now))
    if changed:
        listed = "; ".join(f"{k} {_show(a)} -> {_show(b)}" for k, (a, b) in changed.items())
        hint = (" (train.checkpoint.allow_data_change=true resumes on changed data content)"
                if "data.content" in changed else "")
        raise PreflightError(
            f"cannot resume from {checkpoint}: {len(changed)} setting(s) that define the "
            f"drafter's weights or its sample plan changed since it was written: {listed}. "
            f"Resume with the checkpoint's values, or train a new drafter in another "
            f"train.out_dir{hint}")
    unrecorded = sorted(k for k in contract.fixed if k not in old)
    if KEY in state and unrecorded:  # written by a version that checked fewer settings
        log.warning("checkpoint %s records no value for %s: not checked", checkpoint,
                    ", ".join(unrecorded))
    before = recorded["changeable"]
    for key, value in contract.changeable.items():
        if key in before and before[key] != value:
            log.info("resuming with %s changed: %s -> %s", key, _show(before[key]), _show(value))
