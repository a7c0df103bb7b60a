"""The frozen target: tap features for the drafter, and its embedding and LM head.

Tap features are the outputs of decoder layers ``target_layer_ids`` (HF ``hidden_states``
index ``id + 1``), concatenated on the feature axis. The forward stops after the deepest tap:
deeper layers, the final norm and the LM head never run. A drafter that distils from the
target's next-token distribution (drafter.distill_weight > 0) needs the target's final normed
hidden state as well: then every layer and the final norm run, and that state follows the taps
(H columns more); the drafter applies the LM head it already holds, only at the rows it scores,
so no vocabulary-wide logits are ever computed here or sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

import torch
from safetensors import safe_open
from torch import nn

from pipeline.model.families import embed_scale


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layer list of an HF causal LM (``model.model.layers`` for Llama/Qwen)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no decoder layer list: "
                         "expected a decoder-only HF causal LM (e.g. Qwen3, Llama)")
    return layers


def capture_outputs(layers: dict[int, nn.Module]) -> dict[int, torch.Tensor]:
    """Forward hooks that keep each layer's latest output under its id, in the returned dict
    (HF decoder layers return a tensor or a tuple led by it)."""
    captured: dict[int, torch.Tensor] = {}

    def hook_for(layer_id: int):
        def hook(_module, _inputs, output):
            captured[layer_id] = output[0] if isinstance(output, tuple) else output
        return hook

    for layer_id, layer in layers.items():
        layer.register_forward_hook(hook_for(layer_id))
    return captured


class TargetFeatures(nn.Module):
    """Wraps an HF causal LM cut after its deepest tap and returns concatenated tap features;
    with ``final_hidden``, an uncut one, and its final normed hidden state after the taps.

    Batches are right-padded, and under a causal mask padding after a token never changes that
    token's outputs, so no attention mask is passed: attention takes the fused causal kernel
    (a padding mask would send SDPA to a slower masked kernel). Features at padded positions
    are garbage and never read: the loss mask is 0 there.
    """

    def __init__(self, model: nn.Module, tap_ids: Sequence[int], compile: bool = False,
                 final_hidden: bool = False) -> None:
        super().__init__()
        layers = decoder_layers(model)
        bad = [i for i in tap_ids if not 0 <= i < len(layers)]
        if bad:
            raise ValueError(f"target_layer_ids {list(tap_ids)}: ids {bad} are outside the "
                             f"target's {len(layers)} layers (allowed 0..{len(layers) - 1})")
        if not final_hidden and max(tap_ids) != len(layers) - 1:
            raise ValueError(f"the target must be cut after its deepest tap {max(tap_ids)}, "
                             f"but it has {len(layers)} layers: load it with load_target")
        self.model = model
        self.tap_ids = tuple(tap_ids)
        self.final_hidden = final_hidden
        self._captured = capture_outputs({i: layers[i] for i in set(self.tap_ids)})
        decoder = model.get_decoder()
        self._decoder = torch.compile(decoder, dynamic=None) if compile else decoder

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[N, S] right-padded token ids -> [N, S, n_taps * H] tap features, or
        [N, S, (n_taps + 1) * H] with the final normed hidden state last."""
        self._captured.clear()
        out = self._decoder(input_ids=input_ids, use_cache=False)
        parts = [self._captured[i] for i in self.tap_ids]
        if self.final_hidden:
            parts.append(out.last_hidden_state)  # after the decoder's final norm
        feats = torch.cat(parts, dim=-1)
        self._captured.clear()
        return feats


def load_target(path: Union[str, Path], tap_ids: Sequence[int], device: torch.device,
                dtype: torch.dtype, compile: bool = False,
                final_hidden: bool = False) -> TargetFeatures:
    """Load an HF causal LM from a local folder, keep only the layers up to the deepest tap.

    Nothing after the deepest tap runs: deeper layers are dropped, and the final norm and the
    LM head become identities. With ``final_hidden`` every layer and the final norm are kept
    (the LM head is still never run: the drafter holds its own copy of it).
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    decoder = model.get_decoder()
    if not final_hidden:
        del decoder_layers(model)[max(tap_ids) + 1:]
        if hasattr(decoder, "norm"):
            decoder.norm = nn.Identity()
    if hasattr(model, "lm_head"):
        model.lm_head = nn.Identity()
    model.requires_grad_(False).eval()
    return TargetFeatures(model.to(device), tap_ids, compile=compile, final_hidden=final_hidden)


@dataclass
class TargetHead:
    """The target's frozen embedding and LM head weights, shared by drafter code."""

    embed: torch.Tensor    # [V, H]
    lm_head: torch.Tensor  # [V, H]
    # What the target's embedding module multiplies rows by (families.py: Gemma's sqrt(H)).
    embed_scale: float = 1.0

    def to(self, device, dtype=None) -> "TargetHead":
        return TargetHead(self.embed.to(device, dtype), self.lm_head.to(device, dtype),
                          self.embed_scale)

    @classmethod
    def of_model(cls, model: nn.Module, embed_scale: float = 1.0) -> "TargetHead":
        """The head of a loaded causal LM: its own weight tensors, shared, not copied."""
        return cls(model.get_input_embeddings().weight, model.get_output_embeddings().weight,
                   embed_scale)

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head's greedy token for each row of ``hidden [..., H]``, scored in ``hidden``'s
        dtype.

        Where the head is kept in another dtype (a bf16 target's head scoring an fp32
        drafter's output) its rows are cast a slice of the vocabulary at a time, never
        whole: at Qwen3-8B's vocabulary an fp32 copy of the head is 2.5 GB, which an
        evaluator beside training on one card cannot spare. Casting bf16 to fp32 is exact, so
        the scores are those of the whole head cast at once; ties go to the lowest id, as
        ``argmax`` breaks them."""
        head = self.lm_head
        if head.dtype == hidden.dtype:
            return (hidden @ head.t()).argmax(-1)
        rows = max(1, _CAST_BYTES // (head.shape[1] * hidden.element_size()))
        best = index = None
        for start in range(0, head.shape[0], rows):
            score, found = (hidden @ head[start:start + rows].to(hidden.dtype).t()).max(-1)
            if best is None:
                best, index = score, found
                continue
            better = score > best  # strictly: an equal score keeps the lower id
            best = torch.where(better, score, best)
            index = torch.where(better, found + start, index)
        return index


# The most bytes of the head cast at once in TargetHead.argmax (about 16k rows of Qwen3-8B's
# head in fp32).
_CAST_BYTES = 256 << 20


def weight_files(path: Path) -> dict[str, Path]:
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
    files = weight_files(path)
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
    config = json.loads((path / "config.json").read_text())
    return TargetHead(embed=embed.requires_grad_(False), lm_head=head.requires_grad_(False),
                      embed_scale=embed_scale(config))
