"""Model FLOPs of one drafter micro-batch, counted analytically.

Counted (a multiply-add is 2 FLOPs; backward is twice forward for a trainable matmul):
- body, per block token and layer: q, k, v, o projections and the SwiGLU MLP,
  2*(H*nh*d + 2*H*nkv*d + nh*d*H + 3*H*I), times 3 (forward + input and weight gradients);
- context, per context token: the fc projection 2*F*H (times 2: its input needs no
  gradient) and each layer's k and v projections 2*2*H*nkv*d (times 3);
- attention, per block token: 4*nh*d FLOPs per visible key (QK^T and PV), times 3, where a
  token of the block at anchor a sees a context keys and the B keys of its own block;
- the frozen LM head, per supervised row: 2*H*V forward plus 2*H*V for the input gradient.
Not counted: the head's weight gradient (frozen), recomputation, norms, RoPE, softmax, and
padding (padded anchors and positions are not model work).
"""

from __future__ import annotations

import torch


def drafter_flops(hf: dict, n_taps: int, block_size: int, context_tokens: int,
                  anchors: torch.Tensor, keep: torch.Tensor, supervised_rows: int) -> float:
    """anchors/keep [N, A]: the micro-batch's anchors; context_tokens: real (unpadded) tokens."""
    h, inter, layers = hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"]
    nh, nkv, d, vocab = (hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"],
                         hf["vocab_size"])
    block_tokens = int(keep.sum()) * block_size
    per_token = 2 * (h * nh * d + 2 * h * nkv * d + nh * d * h + 3 * h * inter)
    body = 3 * layers * per_token * block_tokens
    context = context_tokens * (2 * 2 * n_taps * h * h + 3 * layers * 2 * 2 * h * nkv * d)
    visible = float(((anchors.double() + block_size) * keep).sum()) * block_size
    attention = 3 * layers * 4 * nh * d * visible
    head = 4 * h * vocab * supervised_rows
    return float(body + context + attention + head)
