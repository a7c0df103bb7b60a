"""The frozen target: tap features for the drafter, and its embedding and LM head.

Tap features are the outputs of decoder layers ``target_layer_ids`` (HF ``hidden_states``
index ``id + 1``), concatenated on the feature axis. The forward stops after the deepest tap:
deeper layers, the final norm and the LM head never run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

import torch
from safetensors import safe_open
from torch import nn


class _StopForward(Exception):
    """Raised from the deepest tap's hook: nothing after it is needed."""


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layer list of an HF causal LM (``model.model.layers`` for Llama/Qwen)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no decoder layer list: "
                         "expected a decoder-only HF causal LM (e.g. Qwen3, Llama)")
    return layers


class TargetFeatures(nn.Module):
    """Wraps an HF causal LM and returns concatenated tap features."""

    def __init__(self, model: nn.Module, tap_ids: Sequence[int]) -> None:
        super().__init__()
        layers = decoder_layers(model)
        bad = [i for i in tap_ids if not 0 <= i < len(layers)]
        if bad:
            raise ValueError(f"target_layer_ids {list(tap_ids)}: ids {bad} are outside the "
                             f"target's {len(layers)} layers (allowed 0..{len(layers) - 1})")
        self.model = model
        self.tap_ids = tuple(tap_ids)
        self._captured: dict[int, torch.Tensor] = {}
        deepest = max(self.tap_ids)
        for i in set(self.tap_ids):
            layers[i].register_forward_hook(self._make_hook(i, stop=i == deepest))

    def _make_hook(self, index: int, stop: bool):
        def hook(_module, _inputs, output):
            self._captured[index] = output[0] if isinstance(output, tuple) else output
            if stop:
                raise _StopForward
        return hook

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self._captured.clear()
        try:
            self.model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                     use_cache=False)
        except _StopForward:
            pass
        else:
            raise AssertionError("the deepest tap's hook did not fire")
        feats = torch.cat([self._captured[i] for i in self.tap_ids], dim=-1)
        self._captured.clear()
        return feats


def load_target(path: Union[str, Path], tap_ids: Sequence[int], device: torch.device,
                dtype: torch.dtype) -> TargetFeatures:
    """Load an HF causal LM from a local folder, keep only the layers up to the deepest tap."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    layers = decoder_layers(model)
    del layers[max(tap_ids) + 1:]
    # The LM head is never used by the feature path; drop it to save memory.
    if hasattr(model, "lm_head"):
        model.lm_head = nn.Identity()
    model.requires_grad_(False).eval()
    return TargetFeatures(model.to(device), tap_ids)


@dataclass
class TargetHead:
    """The target's frozen embedding and LM head weights, shared by drafter code."""

    embed: torch.Tensor    # [V, H]
    lm_head: torch.Tensor  # [V, H]

    def to(self, device, dtype=None) -> "TargetHead":
        return TargetHead(self.embed.to(device, dtype), self.lm_head.to(device, dtype))


def _weight_files(path: Path) -> dict[str, Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: path / file for name, file in weight_map.items()}
    single = path / "model.safetensors"
    if not single.exists():
        raise ValueError(f"target path {path} has no model.safetensors(.index.json)")
    with safe_open(str(single), "pt") as f:
        return {name: single for name in f.keys()}


def _find(files: dict[str, Path], suffixes: Sequence[str]) -> str | None:
    for suffix in suffixes:
        for name in files:
            if name == suffix or name.endswith("." + suffix):
                return name
    return None


def load_target_head(path: Union[str, Path]) -> TargetHead:
    """Read only the embedding and LM head from the target's safetensors (tied heads too)."""
    path = Path(path)
    files = _weight_files(path)
    embed_name = _find(files, ["model.embed_tokens.weight", "embed_tokens.weight"])
    head_name = _find(files, ["lm_head.weight"])
    if embed_name is None:
        raise ValueError(f"target path {path}: no embed_tokens weight in its safetensors")
    tensors = {}
    for name in filter(None, {embed_name, head_name}):
        with safe_open(str(files[name]), "pt") as f:
            tensors[name] = f.get_tensor(name)
    embed = tensors[embed_name]
    head = tensors[head_name] if head_name else embed  # tied embeddings
    return TargetHead(embed=embed.requires_grad_(False), lm_head=head.requires_grad_(False))
