"""Turn the job config into concrete things once: paths, the drafter spec, device and dtypes.

This runs in the driver (or the single-process trainer) before any actor starts, so a bad
path, tap id or mask token stops the job with a message naming the config key.

The device is where the actors run, which for the driver is the Ray cluster, not the host the
driver runs on: the driver resolves early with this host's guess (so paths are checked before
Ray starts), and again once Ray is up when :func:`cluster_device` decides otherwise from the
cluster's nodes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import torch

from pipeline.job.config import JobConfig
from pipeline.checks.dtypes import resolve_dtype
from pipeline.model.config import DrafterSpec, build_drafter_spec
from pipeline.model.families import UnsupportedTarget, drafter_fields
from pipeline.checks.preflight import PreflightError, check_data_file, check_target_folder


@dataclass(frozen=True)
class ResolvedJob:
    target_path: str
    train_path: str
    heldout_path: str
    spec: DrafterSpec
    device: str                  # "cuda" or "cpu"
    target_dtype: torch.dtype    # the frozen target and the features it hands over
    autocast_dtype: Optional[torch.dtype]  # drafter compute dtype under autocast; None = fp32
    pad_token_id: int
    eos_token_id: Optional[int]


def resolve_device(requested: str) -> str:
    """This process's device: right for the single-process trainer, a guess for the driver."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def cluster_device(requested: str, node_resources: Sequence[Mapping[str, float]]) -> str:
    """``cluster.device`` decided from the resources of the cluster's live nodes.

    A driver on a CPU head submitting to GPU workers must train on CUDA, and one on a GPU
    host submitting to a CPU cluster on CPU: auto means cuda when any node has a GPU.
    An explicit choice is kept, but cuda on a cluster without a GPU is refused here rather
    than as a placement group that never gets scheduled.
    """
    has_gpu = any(resources.get("GPU", 0) > 0 for resources in node_resources)
    if requested == "auto":
        return "cuda" if has_gpu else "cpu"
    if requested == "cuda" and not has_gpu:
        raise ValueError(f"cluster.device='cuda' is not allowed: none of the Ray cluster's "
                         f"{len(node_resources)} live node(s) has a GPU; expected 'cpu' or "
                         f"'auto' (or a cluster.address whose nodes have GPUs)")
    return requested


def check_target_family(key: str, value: str, folder: str) -> None:
    """The target's config.json names a family the drafter can be built for (read as JSON:
    a model_type unknown to transformers is refused here too, not by AutoConfig)."""
    where = f"{key}={value!r}" + ("" if value == folder else f" ({folder})")
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
        drafter_fields(config)
    except UnsupportedTarget as e:
        raise PreflightError(f"{where}: {e}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise PreflightError(f"{where}: config.json cannot be read as a causal LM's config "
                             f"({type(e).__name__}: {e})") from None


def resolve_job(job: JobConfig, device: Optional[str] = None) -> ResolvedJob:
    from transformers import AutoConfig, AutoTokenizer

    from pipeline.assets import resolve_data_path, resolve_target_path
    from pipeline.assets.cache_entry import recheck_after_failure

    target_path = resolve_target_path(job.target.path)
    train_path = resolve_data_path(job.data.train_path, "train")
    heldout_path = resolve_data_path(job.data.heldout_path, "heldout")
    check_target_folder("target.path", job.target.path, target_path)
    check_data_file("data.train_path", job.data.train_path, train_path)
    check_data_file("data.heldout_path", job.data.heldout_path, heldout_path)
    check_target_family("target.path", job.target.path, target_path)
    device = device or resolve_device(job.cluster.device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(target_path)
    except Exception:
        # A cached target (the demo's, a GGUF conversion) is hashed once a load from it
        # fails: a damaged copy is made again, in one line, and loaded once more.
        if recheck_after_failure(target_path) is None:
            raise
        target_path = resolve_target_path(job.target.path)
        tokenizer = AutoTokenizer.from_pretrained(target_path)
    target_config = AutoConfig.from_pretrained(target_path).to_dict()
    spec = build_drafter_spec(target_config, job.drafter, tokenizer.mask_token_id)
    target_dtype = resolve_dtype(job.target.dtype, device)
    precision = job.train.precision
    if precision == "auto":
        precision = "bf16" if device == "cuda" else "fp32"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return ResolvedJob(
        target_path=target_path,
        train_path=train_path, heldout_path=heldout_path,
        spec=spec, device=device, target_dtype=target_dtype,
        autocast_dtype=torch.bfloat16 if precision == "bf16" else None,
        pad_token_id=int(pad if pad is not None else 0),
        eos_token_id=tokenizer.eos_token_id)
