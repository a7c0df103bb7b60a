"""The DFlash drafter: Qwen3 decoder layers whose attention also reads the target's features.

Block tokens (an anchor token followed by mask tokens) are the queries. Keys and values are
``concat(proj(context), proj(block))`` in every layer ("KV injection"), where ``context`` is
``hidden_norm(fc(concatenated tap features))``. The drafter owns no embedding and no LM head:
callers embed the block with the target's embedding and score its output with the target's head.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from pipeline.model.config import DrafterSpec
from pipeline.model.norm import RMSNorm
from pipeline.model.qwen3_parts import drafter_config, mlp, rotary_embedding, rotate_half

# A dense boolean mask [N, 1, Q, K] (True = may attend) for SDPA, or a flex BlockMask.
AttentionMask = Union[torch.Tensor, BlockMask, None]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # cos/sin: [N, L, D] -> broadcast over heads of x: [N, heads, L, D]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


_compiled_flex = None


def _flex_kernel():
    """flex_attention as a fused kernel outside a compiled region.

    Run eagerly, flex_attention falls back to a reference path that materialises the full
    [N, heads, Q, K] scores (104 GB at the Qwen3-8B shape). Inside a compiled drafter it is
    already fused; an uncompiled drafter on CUDA gets this compiled kernel instead.

    ``dynamic=None`` (automatic dynamic): the first shape compiles static, the first change of
    sequence length or anchor count recompiles once with symbolic sizes, and that kernel
    serves every later shape. ``dynamic=False`` recompiled for every new shape and, past
    dynamo's ``recompile_limit`` (8), ran the materialising eager path: an OOM with
    ``static_shapes=false`` at the 8B shape. Under static shapes only one shape is ever seen,
    so it still compiles once, statically.
    """
    global _compiled_flex
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=None)
    return _compiled_flex


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask,
           scale: float) -> torch.Tensor:
    """Attention over [N, heads, L, D] tensors with grouped KV heads, by mask type."""
    if isinstance(mask, BlockMask):
        fn = flex_attention
        if q.is_cuda and not torch.compiler.is_compiling():
            fn = _flex_kernel()
        return fn(q, k, v, block_mask=mask, scale=scale, enable_gqa=True)
    if mask is not None and k.shape[1] != q.shape[1]:
        # SDPA's fused kernels take an explicit mask only without enable_gqa; with it, CUDA
        # falls back to the math kernel and materialises the scores. Expanding the KV heads
        # costs a copy of K and V but keeps the memory-efficient kernel.
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


class DFlashAttention(nn.Module):
    def __init__(self, hf_config) -> None:
        super().__init__()
        c = hf_config
        self.head_dim = c.head_dim
        self.num_heads = c.num_attention_heads
        self.num_kv_heads = c.num_key_value_heads
        self.scale = self.head_dim ** -0.5
        bias = c.attention_bias
        self.q_proj = nn.Linear(c.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(c.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(c.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, c.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, eps=c.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, eps=c.rms_norm_eps)

    def forward(self, x: torch.Tensor, context: torch.Tensor, rope_q, rope_k,
                mask: AttentionMask) -> torch.Tensor:
        n, q_len, _ = x.shape
        kv_len = context.shape[1] + q_len
        q = self.q_norm(self.q_proj(x).view(n, q_len, self.num_heads, self.head_dim))
        # KV injection: the target's context and the block share one key/value sequence.
        kv_in = torch.cat([context, x], dim=1)
        k = self.k_norm(self.k_proj(kv_in).view(n, kv_len, self.num_kv_heads, self.head_dim))
        v = self.v_proj(kv_in).view(n, kv_len, self.num_kv_heads, self.head_dim)
        q = _rope(q.transpose(1, 2), *rope_q)
        k = _rope(k.transpose(1, 2), *rope_k)
        out = attend(q, k, v.transpose(1, 2), mask, self.scale)
        return self.o_proj(out.transpose(1, 2).reshape(n, q_len, -1))


class DFlashLayer(nn.Module):
    def __init__(self, hf_config) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(hf_config)
        self.mlp = mlp(hf_config)
        self.input_layernorm = RMSNorm(hf_config.hidden_size, eps=hf_config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(hf_config.hidden_size,
                                                     eps=hf_config.rms_norm_eps)

    def forward(self, x, context, rope_q, rope_k, mask):
        x = x + self.self_attn(self.input_layernorm(x), context, rope_q, rope_k, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """Parameter names match the DFlash checkpoint format (``layers.{i}.*``, ``fc``, ...)."""

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.spec = spec
        hf = drafter_config(spec.hf_config)
        self.layers = nn.ModuleList(DFlashLayer(hf) for _ in range(hf.num_hidden_layers))
        self.fc = nn.Linear(spec.feature_size, hf.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(hf.hidden_size, eps=hf.rms_norm_eps)
        self.norm = RMSNorm(hf.hidden_size, eps=hf.rms_norm_eps)
        self.rotary_emb = rotary_embedding(hf)
        self.reset_parameters(hf.initializer_range)

    @classmethod
    def for_loading(cls, spec: DrafterSpec, device: torch.device | str) -> "DFlashDrafter":
        """A drafter on ``device`` whose every weight is about to be loaded (an evaluator's, an
        export's), built without drawing random weights: at the 8B recipe's 1.05B parameters
        that is 15-20 s of one CPU thread. Its rotary tables (buffers no state dict holds) are
        computed as the constructor computes them."""
        with torch.device("meta"):
            model = cls(spec)
        model.to_empty(device=device)
        model.rotary_emb = rotary_embedding(drafter_config(spec.hf_config)).to(device)
        return model

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                module.weight.normal_(0.0, std)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)

    def forward(self, features: torch.Tensor, block_embeds: torch.Tensor,
                context_positions: torch.Tensor, block_positions: torch.Tensor,
                mask: AttentionMask) -> torch.Tensor:
        """Hidden states of the block tokens, before the target's LM head.

        features: [N, S, n_taps*H] tap features of the context; block_embeds: [N, Q, H];
        context_positions: [N, S]; block_positions: [N, Q]; mask over Q x (S + Q) keys.
        """
        dtype = compute_dtype(self.fc.weight, features.device.type)
        context = self.hidden_norm(self.fc(features.to(dtype)))
        x = block_embeds.to(dtype)
        rope_q = self.rotary_emb(x, block_positions)
        rope_k = self.rotary_emb(x, torch.cat([context_positions, block_positions], dim=1))
        for layer in self.layers:
            x = layer(x, context, rope_q, rope_k, mask)
        return self.norm(x)


def compute_dtype(weight: torch.Tensor, device_type: str) -> torch.dtype:
    """The dtype activations should carry: autocast's when it is on, else the weights'."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return weight.dtype


def embed_tokens(embed_weight: torch.Tensor, token_ids: torch.Tensor,
                 dtype: Optional[torch.dtype] = None, scale: float = 1.0) -> torch.Tensor:
    """Rows of the target's embedding as the target's own embedding module returns them:
    ``scale`` (Gemma: sqrt(hidden), see families.py) multiplies in the weight's dtype, as
    there."""
    out = F.embedding(token_ids, embed_weight)
    if scale != 1.0:
        # The scale rounded to the weight's dtype as the target holds it, passed as a Python
        # number: a tensor made here would be a host-to-device copy, which a CUDA graph of the
        # evaluator's draft step cannot capture.
        out = out * torch.tensor(scale, dtype=embed_weight.dtype).item()
    return out if dtype is None else out.to(dtype)
