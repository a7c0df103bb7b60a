"""Initial drafter weights taken from the target (``drafter.init=target_layers``).

A drafter layer has the target's decoder layer shapes and parameter names (Qwen3: attention
projections, q/k norms, SwiGLU MLP, two RMSNorms), so the target's last layers are a drafter
stack that already turns hidden states into the features the target's own LM head reads. The
drafter's final ``norm`` feeds that same head, so it takes the target's final norm. ``fc`` and
``hidden_norm`` have no counterpart in the target and keep their random init.

The weights are read from the target's safetensors by name, without building the model, and
copied over the seeded random init, so every replica and the reference trainer start
identical. Only the starting point changes: the export format and the training are the same.

A Llama layer is a Qwen3 layer without the per-head q/k RMSNorms. Its projections, MLP and
norms are copied; the drafter's q/k norms keep their init (ones), so the copied attention
scores normalised q and k and computes another function until training adapts it: a start
that keeps the target's features, not the target's layer (one log line says so).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch
from safetensors import safe_open

from pipeline.model.config import DrafterConfig, DrafterSpec, resolve_init_layer_ids
from pipeline.model.target import weight_files

log = logging.getLogger(__name__)

# Drafter layer parameters a family's layer has no counterpart for: they keep their init.
_NOT_IN_FAMILY = {"llama": ("self_attn.q_norm.weight", "self_attn.k_norm.weight")}


@dataclass(frozen=True)
class TargetInit:
    """Copy target decoder layer ``layer_ids[j]`` into drafter layer j (and the final norm)."""

    target_path: str
    layer_ids: tuple[int, ...]


def target_init_of(options: DrafterConfig, spec: DrafterSpec,
                   target_path: str) -> Optional[TargetInit]:
    """What ``drafter.init`` asks for: None for ``random``."""
    if options.init == "random":
        return None
    ids = resolve_init_layer_ids(options, int(spec.hf_config["num_target_layers"]))
    return TargetInit(str(target_path), tuple(ids))


def _layer_prefix(names: Sequence[str], layer: int) -> Optional[str]:
    """The name prefix of decoder layer ``layer`` (``model.layers.{i}.`` for Qwen3/Llama)."""
    marker = f"layers.{layer}."
    for name in names:
        at = name.find(marker)
        if at == 0 or (at > 0 and name[at - 1] == "."):
            return name[:at + len(marker)]
    return None


def target_init_weights(init: TargetInit, drafter_names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Drafter-named tensors read from the target's safetensors. Every drafter layer
    parameter must be found there; a missing one is refused (a target not shaped like Qwen3)."""
    path = Path(init.target_path)
    files = weight_files(path)
    names = sorted(files)
    config = path / "config.json"
    model_type = json.loads(config.read_text()).get("model_type") if config.exists() else None
    not_in_family = _NOT_IN_FAMILY.get(model_type, ())
    if not_in_family:
        log.info("drafter.init=target_layers: %s layers have no %s; the drafter's keep their "
                 "init (ones), so the copied attention differs from the target's until trained",
                 model_type, " or ".join(not_in_family))
    wanted: dict[str, str] = {}  # drafter name -> target name
    for j, layer in enumerate(init.layer_ids):
        prefix = _layer_prefix(names, layer)
        if prefix is None:
            raise ValueError(f"drafter.init=target_layers: target {path} has no weights for "
                             f"decoder layer {layer}")
        own = f"layers.{j}."
        wanted.update({n: prefix + n[len(own):] for n in drafter_names
                       if n.startswith(own) and not n.endswith(not_in_family)})
    norm = next((n for n in names if n.endswith("model.norm.weight") or n == "norm.weight"),
                None)
    if norm is not None and "norm.weight" in drafter_names:
        wanted["norm.weight"] = norm
    missing = sorted(d for d, t in wanted.items() if t not in files)
    if missing:
        raise ValueError(f"drafter.init=target_layers: target {path} lacks "
                         f"{[wanted[m] for m in missing]} for drafter weights {missing}")
    out = {}
    for drafter_name, target_name in wanted.items():
        with safe_open(str(files[target_name]), "pt") as f:
            out[drafter_name] = f.get_tensor(target_name)
    return out


@torch.no_grad()
def apply_target_init(model: torch.nn.Module, init: TargetInit) -> None:
    """Overwrite ``model``'s layers (and final norm) with the target's; shapes must match."""
    params = dict(model.named_parameters())
    for name, tensor in target_init_weights(init, list(params)).items():
        if tuple(params[name].shape) != tuple(tensor.shape):
            raise ValueError(f"drafter.init=target_layers: {name} is {tuple(tensor.shape)} in "
                             f"the target but {tuple(params[name].shape)} in the drafter")
        params[name].copy_(tensor.to(params[name].dtype))
