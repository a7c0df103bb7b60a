"""The drafter's Qwen3 pieces (config, MLP, RoPE) without importing transformers.

A drafter actor is a fresh Python process: transformers' Qwen3 modules bring its model stack
and torch._dynamo, 1-2 CPU-seconds per actor, for three small pieces. These compute what
transformers' Qwen3MLP and Qwen3RotaryEmbedding compute, op for op, under the same parameter
and buffer names. Only the common case takes this path: SiLU, default RoPE and a config with
every field the drafter reads; any other config gets transformers' own classes
(:func:`drafter_config`, :func:`mlp`, :func:`rotary_embedding`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from pipeline.model.config import hf_qwen3_config

# What the drafter reads of its config, each of these types (bool before int: a bool is one).
_FIELDS = {"hidden_size": int, "intermediate_size": int, "num_hidden_layers": int,
           "num_attention_heads": int, "num_key_value_heads": int, "head_dim": int,
           "rms_norm_eps": float, "initializer_range": float, "attention_bias": bool,
           "max_position_embeddings": int}


def _qwen3():
    from transformers.models.qwen3 import modeling_qwen3

    return modeling_qwen3


def _default_rope(hf_config: dict) -> bool:
    rope = hf_config.get("rope_parameters")
    return (isinstance(rope, dict) and set(rope) == {"rope_type", "rope_theta"}
            and rope["rope_type"] == "default"
            and type(rope["rope_theta"]) in (int, float)
            and hf_config.get("rope_theta", rope["rope_theta"]) == rope["rope_theta"]
            and not hf_config.get("rope_scaling"))


def _plain(hf_config: dict) -> bool:
    """Whether every field the drafter reads is given, of its type, with SiLU and default
    RoPE: what transformers' Qwen3Config then holds is these values as given."""
    for key, kind in _FIELDS.items():
        value = hf_config.get(key)
        if type(value) is not kind:  # noqa: E721 (a bool is no int here)
            return False
    return hf_config.get("hidden_act") == "silu" and _default_rope(hf_config)


def drafter_config(hf_config: dict) -> Any:
    """The drafter's dims as attributes: the dict's own values where :func:`_plain` holds,
    else transformers' Qwen3Config of it (which fills defaults and converts RoPE fields)."""
    if _plain(hf_config):
        return SimpleNamespace(hidden_act="silu", **{k: hf_config[k] for k in _FIELDS},
                               rope_parameters=dict(hf_config["rope_parameters"]))
    return hf_qwen3_config(hf_config)


def _is_own(config: Any) -> bool:
    return isinstance(config, SimpleNamespace)


class MLP(nn.Module):
    """transformers' Qwen3MLP with SiLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.intermediate_size = config.intermediate_size
        self.gate_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.up_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.down_proj = nn.Linear(self.intermediate_size, self.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class RotaryEmbedding(nn.Module):
    """transformers' Qwen3RotaryEmbedding for default RoPE: (cos, sin) of the positions."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.max_seq_len_cached = config.max_position_embeddings
        self.original_max_seq_len = config.max_position_embeddings
        self.rope_type = "default"
        base, dim = config.rope_parameters["rope_theta"], config.head_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        self.attention_scaling = 1.0
        self.inv_freq = nn.Buffer(inv_freq, persistent=False)
        self.original_inv_freq = nn.Buffer(inv_freq.clone(), persistent=False)

    def forward(self, x: torch.Tensor,
                position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device,
                                                                   dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def mlp(config: Any) -> nn.Module:
    return MLP(config) if _is_own(config) else _qwen3().Qwen3MLP(config)


def rotary_embedding(config: Any) -> nn.Module:
    return RotaryEmbedding(config) if _is_own(config) else _qwen3().Qwen3RotaryEmbedding(config)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers' rotate_half: (x1, x2) -> (-x2, x1) over the last axis's halves."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
