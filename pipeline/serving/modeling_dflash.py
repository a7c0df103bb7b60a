"""A DFlash drafter for ``AutoModel.from_pretrained(folder, trust_remote_code=True)``.

This file is copied into every exported drafter folder, and ``config.json`` names it under
``auto_map``. It must stay standalone: it imports only torch and transformers, never the
training package that wrote it.

    from transformers import AutoModel
    drafter = AutoModel.from_pretrained("drafter-qwen3-8b", trust_remote_code=True)
    hidden = drafter(position_ids=positions, noise_embedding=target.model.embed_tokens(block),
                     target_hidden=tap_features)          # [N, Q, H], before the LM head
    logits = target.lm_head(hidden)

The drafter has no embedding and no LM head: the block (an anchor token, then mask tokens) is
embedded with the target's embedding, and its output is scored with the target's head.
``target_hidden`` is the concatenation of the target's decoder-layer outputs at
``config.dflash_config["target_layer_ids"]`` (HF ``hidden_states[i + 1]``) for the context.
``position_ids`` covers the uncached context followed by the block: [N, S + Q].
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel, Qwen3Config
from transformers.activations import ACT2FN


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 whatever the weights' dtype, as the Qwen3 target does.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _rope_frequencies(config: Any, device: torch.device) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the cos/sin scale, from the config's rope fields."""
    params = getattr(config, "rope_parameters", None)
    if not params:  # transformers 4 keeps them flat
        params = dict(getattr(config, "rope_scaling", None) or {},
                      rope_theta=getattr(config, "rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        return ROPE_INIT_FUNCTIONS[rope_type](config, device)
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim
    return 1.0 / (float(params["rope_theta"]) ** exponents), 1.0


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply RoPE to [N, heads, L, D] with cos/sin [N, L, D]."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(1) + turned * sin.unsqueeze(1)


class DFlashAttention(nn.Module):
    """Block queries over keys/values of [context | block]: KV injection, no causal mask."""

    def __init__(self, config: Any, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, context: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, mask: Optional[torch.Tensor],
                cache: Optional[Any]) -> torch.Tensor:
        n, q_len, _ = x.shape
        kv_in = torch.cat([context, x], dim=1)
        kv_len = kv_in.shape[1]
        q = self.q_norm(self.q_proj(x).view(n, q_len, self.heads, self.head_dim))
        k = self.k_norm(self.k_proj(kv_in).view(n, kv_len, self.kv_heads, self.head_dim))
        v = self.v_proj(kv_in).view(n, kv_len, self.kv_heads, self.head_dim).transpose(1, 2)
        # cos/sin cover [context | block]; the queries are the block, i.e. the last q_len.
        q = _rotate(q.transpose(1, 2), cos[:, -q_len:], sin[:, -q_len:])
        k = _rotate(k.transpose(1, 2), cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True,
                                             scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(n, q_len, -1))


class DFlashMLP(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, config: Any, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = DFlashMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, context, cos, sin, mask, cache):
        x = x + self.self_attn(self.input_layernorm(x), context, cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(PreTrainedModel):
    """Weights ``layers.{i}.*``, ``fc``, ``hidden_norm``, ``norm``; see the module docstring."""

    config_class = Qwen3Config
    base_model_prefix = "dflash"
    _no_split_modules = ["DFlashLayer"]
    _supports_sdpa = True

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__(config)
        dflash = config.dflash_config
        self.block_size = int(config.block_size)
        self.mask_token_id = int(dflash["mask_token_id"])
        self.target_layer_ids = [int(i) for i in dflash["target_layer_ids"]]
        hidden = config.hidden_size
        self.layers = nn.ModuleList(DFlashLayer(config, i)
                                    for i in range(config.num_hidden_layers))
        self.fc = nn.Linear(len(self.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        # Only weights absent from the checkpoint reach this; the export carries all of them.
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=getattr(self.config, "initializer_range", 0.02))
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    def forward(self, position_ids: torch.Tensor, noise_embedding: torch.Tensor,
                target_hidden: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                past_key_values: Optional[Any] = None, use_cache: bool = False,
                **_ignored: Any) -> torch.Tensor:
        """Hidden states of the block tokens after the final norm: [N, Q, H].

        position_ids: [N, S + Q], the new context positions then the block's.
        noise_embedding: [N, Q, H], the block embedded with the target's embedding.
        target_hidden: [N, S, n_taps * H], tap features of the new context tokens.
        attention_mask: None (every block token sees every key) or a boolean (True = attend)
        or additive mask [N, 1, Q, keys]. past_key_values: a transformers Cache; with it,
        keys of earlier calls are kept, and the caller crops the block's entries off.
        use_cache and other keywords are accepted so that decoding loops written for
        z-lab's drafter can call this one; the cache is used whenever it is given.
        """
        context = self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))
        x = noise_embedding.to(context.dtype)
        inv_freq, scale = _rope_frequencies(self.config, x.device)
        angles = position_ids[..., None].float() * inv_freq.to(x.device)
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = (angles.cos() * scale).to(x.dtype), (angles.sin() * scale).to(x.dtype)
        for layer in self.layers:
            x = layer(x, context, cos, sin, attention_mask, past_key_values)
        return self.norm(x)
