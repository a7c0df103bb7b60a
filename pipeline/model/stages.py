"""One slice of the target's decoder layers: a pipeline stage (``target.stages``).

The target, cut after its deepest tap, is split into ``k`` contiguous slices of decoder layers
(:func:`split_layers`); stage 0 also embeds the token ids. Each stage runs the HF decoder's own
forward over its slice (``inputs_embeds`` = the previous stage's output), so rotary embeddings,
position ids and the causal mask are recomputed per stage from the sequence length exactly as
the whole model computes them.

Only the stage's own weights are ever read: the model is built on the meta device with its
slice of layers, then those tensors are read from the safetensors files straight onto the
stage's device (:func:`load_target_stage`). Checkpoints whose tensor names do not map one to
one onto the model's (transformers converts some, e.g. fused MoE experts) are loaded through
``from_pretrained`` on the host instead, then cut; that path is logged.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import torch
from safetensors import safe_open
from torch import nn

from pipeline.model.target import capture_outputs, decoder_layers, weight_files

log = logging.getLogger(__name__)

_LAYER_KEY = "model.layers."


def split_layers(num_layers: int, stages: int) -> list[tuple[int, int]]:
    """``stages`` contiguous ``[start, end)`` slices of ``num_layers`` layers, as even as can be.

    The later stages take the spare layers: stage 0 also holds the embedding.
    """
    if not 1 <= stages <= num_layers:
        raise ValueError(f"target.stages={stages} is not allowed: the target cut after its "
                         f"deepest tap has {num_layers} decoder layers, and each stage holds at "
                         f"least one; allowed 1..{num_layers}")
    base, spare = divmod(num_layers, stages)
    sizes = [base + (s >= stages - spare) for s in range(stages)]
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


@dataclass(frozen=True)
class StagePlan:
    """What stage ``stage`` of ``num_stages`` computes and which tap columns it writes."""

    stage: int
    num_stages: int
    start: int  # first decoder layer held
    end: int  # one past the last
    tap_ids: tuple[int, ...]  # every tap of the target, in feature order

    @classmethod
    def of(cls, tap_ids: Sequence[int], stage: int, num_stages: int) -> "StagePlan":
        bounds = split_layers(max(tap_ids) + 1, num_stages)
        if not 0 <= stage < num_stages:
            raise ValueError(f"stage {stage} is outside 0..{num_stages - 1}")
        start, end = bounds[stage]
        return cls(stage, num_stages, start, end, tuple(tap_ids))

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.num_stages - 1

    def columns(self) -> list[tuple[int, int]]:
        """(position in the feature concat, layer id) of each tap this stage holds."""
        return [(j, i) for j, i in enumerate(self.tap_ids) if self.start <= i < self.end]


class TargetStage(nn.Module):
    """A decoder slice: token ids (stage 0) or hidden states in, hidden states and taps out."""

    def __init__(self, model: nn.Module, plan: StagePlan, compile: bool = False) -> None:
        super().__init__()
        self.model = model
        self.plan = plan
        layers = decoder_layers(model)
        assert len(layers) == plan.end - plan.start, (len(layers), plan)
        self._captured = capture_outputs({layer_id: layers[layer_id - plan.start]
                                          for _, layer_id in plan.columns()})
        decoder = model.get_decoder()
        self._decoder = torch.compile(decoder, dynamic=None) if compile else decoder

    @torch.no_grad()
    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """[N, S] token ids (stage 0) or [N, S, H] hidden states -> (hidden out, taps by layer).

        No attention mask, as in ``TargetFeatures``: batches are right-padded and causal.
        """
        self._captured.clear()
        if self.plan.first:
            out = self._decoder(input_ids=inputs, use_cache=False)
        else:
            out = self._decoder(inputs_embeds=inputs, use_cache=False)
        taps = dict(self._captured)
        self._captured.clear()
        return out.last_hidden_state, taps


def stage_config(config, plan: StagePlan):
    """The HF config of one stage: its layers only, and their own attention types."""
    cfg = copy.deepcopy(config)
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        # The decoder looks a layer's mask up by its position in the list it runs.
        cfg.layer_types = list(types[plan.start:plan.end])
    cfg.num_hidden_layers = plan.end - plan.start
    return cfg


def _cut(model: nn.Module, plan: StagePlan) -> None:
    """Keep layers [start, end) (already only [0, end) built), drop what the stage never runs."""
    layers = decoder_layers(model)
    del layers[plan.end:]
    del layers[:plan.start]
    decoder = model.get_decoder()
    if hasattr(decoder, "norm"):
        decoder.norm = nn.Identity()
    if hasattr(model, "lm_head"):
        model.lm_head = nn.Identity()
    if not plan.first:
        decoder.embed_tokens = None  # never run: later stages get hidden states


def checkpoint_name(local: str, plan: StagePlan) -> str:
    """The checkpoint's tensor name of a stage-local one: layer indices shift by ``start``."""
    if local.startswith(_LAYER_KEY):
        index, rest = local[len(_LAYER_KEY):].split(".", 1)
        return f"{_LAYER_KEY}{int(index) + plan.start}.{rest}"
    return local


def load_target_stage(path: Union[str, Path], tap_ids: Sequence[int], stage: int,
                      num_stages: int, device: torch.device | str, dtype: torch.dtype,
                      compile: bool = False) -> TargetStage:
    """Stage ``stage`` of the target at ``path`` on ``device``, reading only its own weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    plan = StagePlan.of(tap_ids, stage, num_stages)
    device = torch.device(device)
    config = AutoConfig.from_pretrained(str(path))
    if max(tap_ids) >= config.num_hidden_layers:
        raise ValueError(f"target_layer_ids {list(tap_ids)} reach past the target's "
                         f"{config.num_hidden_layers} layers")
    # Built up to the stage's last layer only; the earlier ones are cut before any memory.
    built = copy.deepcopy(config)
    built.num_hidden_layers = plan.end
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(built, dtype=dtype)
    _cut(model, plan)
    # From the built model's config: it carries the attention implementation resolved.
    model.config = model.get_decoder().config = stage_config(model.config, plan)
    if not _load_slice(model, Path(path), plan, device, dtype):
        log.info("target stage %d: tensor names differ from the model's, loading through "
                 "from_pretrained on the host and cutting", stage)
        model = AutoModelForCausalLM.from_pretrained(str(path), config=built, dtype=dtype)
        _cut(model, plan)
        model.config = model.get_decoder().config = stage_config(model.config, plan)
        model.to(device)
    _rebuild_rotary(model, device)
    model.requires_grad_(False).eval()
    return TargetStage(model, plan, compile=compile)


def _load_slice(model: nn.Module, path: Path, plan: StagePlan, device: torch.device,
                dtype: torch.dtype) -> bool:
    """Read the stage's tensors from the safetensors onto ``device``; False if names differ."""
    files = weight_files(path)
    wanted = {name: checkpoint_name(name, plan) for name in model.state_dict()}
    if any(source not in files for source in wanted.values()):
        return False
    model.to_empty(device=device)
    state = model.state_dict()
    by_file: dict[Path, list[str]] = {}
    for local, source in wanted.items():
        by_file.setdefault(files[source], []).append(local)
    on = "cpu" if device.type == "cpu" else f"cuda:{torch.cuda.current_device()}"
    with torch.no_grad():
        for file, names in by_file.items():
            with safe_open(str(file), "pt", device=on) as f:
                for local in names:
                    state[local].copy_(f.get_tensor(wanted[local]).to(dtype))
    return True


def _rebuild_rotary(model: nn.Module, device: torch.device) -> None:
    """Rotary modules hold non-persistent buffers made at init: remake them for real."""
    for name, module in list(model.named_modules()):
        if name.endswith("rotary_emb") and hasattr(module, "config"):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            fresh = type(module)(config=module.config).to(device)
            setattr(parent, name.rsplit(".", 1)[-1], fresh)


def stage_weight_bytes(path: Union[str, Path], tap_ids: Sequence[int], num_stages: int,
                       dtype_bytes: int = 2) -> list[int]:
    """Weight bytes each stage holds at ``dtype_bytes`` per element (2: bf16), from the
    safetensors headers alone (no tensor is read): layers per slice, the embedding on stage 0.
    Nothing after the deepest tap counts (deeper layers, final norm and head never load)."""
    bounds = split_layers(max(tap_ids) + 1, num_stages)
    out = [0] * num_stages
    for name, numel in tensor_numels(Path(path)).items():
        layer = _layer_of(name)
        if layer is None:
            if "embed_tokens" in name:
                out[0] += numel * dtype_bytes
            continue
        for s, (start, end) in enumerate(bounds):
            if start <= layer < end:
                out[s] += numel * dtype_bytes
    return out


def tensor_numels(path: Path) -> dict[str, int]:
    """Elements of every tensor in a target's safetensors, read from the headers only."""
    import math

    numels: dict[str, int] = {}
    files = weight_files(path)
    for file in set(files.values()):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                numels[name] = math.prod(f.get_slice(name).get_shape())
    return numels


def _layer_of(name: str) -> Optional[int]:
    marker = "layers."
    at = name.find(marker)
    if at < 0:
        return None
    index = name[at + len(marker):].split(".", 1)[0]
    return int(index) if index.isdigit() else None


class StagedTargetFeatures(nn.Module):
    """All stages of a staged target in one process, as ``TargetFeatures``: token ids in,
    concatenated tap features out. The single-process reference runs ``target.stages`` so."""

    def __init__(self, stages: Sequence[TargetStage]) -> None:
        super().__init__()
        self.stages = nn.ModuleList(stages)
        self.tap_ids = stages[0].plan.tap_ids

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x, taps = input_ids, {}
        for stage in self.stages:
            x, held = stage(x)
            taps.update(held)
        return torch.cat([taps[i] for i in self.tap_ids], dim=-1)


def load_staged_target(path: Union[str, Path], tap_ids: Sequence[int], num_stages: int,
                       device: torch.device | str, dtype: torch.dtype,
                       compile: bool = False) -> StagedTargetFeatures:
    return StagedTargetFeatures([load_target_stage(path, tap_ids, s, num_stages, device, dtype,
                                                   compile) for s in range(num_stages)])
