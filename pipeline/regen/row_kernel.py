"""A decode-step attention kernel over the static decoder's token-major row cache (Triton).

    from pipeline.regen.row_kernel import rows_decode
    out = rows_decode(query, keys, values, lengths, scale)   # [rows, heads, d]

One query token per row; row ``r`` attends to the first ``lengths[r]`` slots of its own cache
row (``keys``/``values`` ``[rows, capacity, kv_heads, d]``, the layout of ``RowCache(
token_major=True)``). It is the static decoder's ``triton`` step attention
(pipeline/regen/static_attention.py), which feeds it what the ``varlen`` step feeds the flash
kernel.

Why a kernel of ours: on the H200 at the Qwen3-8B shape (512 rows, about 450 filled columns),
the flash kernel's variable-length form took 345 us a layer, 39% of a captured step, reading
the cache at 43% of HBM bandwidth (docs/BENCHMARKS.md, 2026-12-04 day 4). Its forward tiles
128 query rows a block; a decode row brings one query per head, and even with each kv head's
query group folded in (4 queries at 8B) 124 of the 128 tile rows are padding, so the block
does 32 times the useful tensor-core work. Here a program serves one (row, kv head): its
group's queries padded to 16 (the least ``tl.dot`` takes) against the row's filled keys, one
pass over them with an online softmax, so the cache is read once and the kernel is bound by
that read. No split over the keys: the regeneration's batches give thousands of programs
(rows x kv heads), enough to fill the device.

Triton's interpreter (``TRITON_INTERPRET=1``) runs the same kernel on CPU tensors, in fp32
(its ``tl.dot`` mishandles bf16 as of Triton 3.9): the CPU test of the kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)); exp2 is the cheaper instruction
BLOCK_N = 64      # cache slots a loop iteration reads
NUM_WARPS = 4
NUM_STAGES = 2    # two K/V tiles in flight: 64 KB of shared memory at d=128 in bf16


@triton.jit
def _rows_decode(Q, K, V, L, O, qk_scale,
                 s_qr, s_qh, s_kr, s_kt, s_kh, s_vr, s_vt, s_vh, s_or, s_oh,
                 GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr,
                 D_PAD: tl.constexpr, BLOCK: tl.constexpr, PRECISION: tl.constexpr):
    # 64-bit: a layer's cache passes 2**31 elements (512 rows x 4,352 slots at Qwen3-8B's
    # 1,024 values a slot), and program ids and strides are 32-bit.
    row = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    length = tl.load(L + row)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D_PAD)
    n = tl.arange(0, BLOCK)
    heads = kv_head * GROUP + g
    q_mask = (g < GROUP)[:, None] & (d < D)[None, :]
    q = tl.load(Q + row * s_qr + heads[:, None] * s_qh + d[None, :], mask=q_mask, other=0.0)
    top = tl.full([GROUP_PAD], float("-inf"), tl.float32)   # running max of the scores
    total = tl.zeros([GROUP_PAD], tl.float32)               # running softmax denominator
    acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
    k_row = K + row * s_kr + kv_head * s_kh
    v_row = V + row * s_vr + kv_head * s_vh
    for start in range(0, length, BLOCK):
        cols = start + n
        filled = cols < length
        kv_mask = filled[:, None] & (d < D)[None, :]
        k = tl.load(k_row + cols[:, None] * s_kt + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        s = tl.where(filled[None, :], s, float("-inf"))
        new_top = tl.maximum(top, tl.max(s, 1))
        rescale = tl.exp2(top - new_top)
        p = tl.exp2(s - new_top[:, None])
        total = total * rescale + tl.sum(p, 1)
        v = tl.load(v_row + cols[:, None] * s_vt + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        top = new_top
    out = acc / total[:, None]
    tl.store(O + row * s_or + heads[:, None] * s_oh + d[None, :], out.to(O.dtype.element_ty),
             mask=q_mask)


# An opaque custom op, not a triton_op: torch.compile's step then calls it as it is (a fake
# implementation gives the output's shape), with nothing of the kernel for dynamo to analyse.
@torch.library.custom_op("pipeline::rows_decode", mutates_args=())
def rows_decode(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                lengths: torch.Tensor, scale: float) -> torch.Tensor:
    """``query [rows, heads, d]`` (any strides with a unit last one), ``keys``/``values``
    ``[rows, capacity, kv_heads, d]``, ``lengths [rows]`` int32 (each >= 1) ->
    ``[rows, heads, d]``: each row's softmax(q k^T * scale) v over its first ``lengths`` slots,
    head ``h`` reading kv head ``h // (heads // kv_heads)``."""
    rows, heads, dim = query.shape
    kv_heads = keys.shape[2]
    out = torch.empty((rows, heads, dim), dtype=query.dtype, device=query.device)
    _rows_decode[(rows, kv_heads)](
        query, keys, values, lengths, out, scale * LOG2E,
        query.stride(0), query.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2), out.stride(0), out.stride(1),
        GROUP=heads // kv_heads, GROUP_PAD=max(16, triton.next_power_of_2(heads // kv_heads)),
        D=dim, D_PAD=max(16, triton.next_power_of_2(dim)), BLOCK=BLOCK_N,
        # fp32 (tests): exact products, not TF32's 10-bit mantissa; bf16/fp16: Triton's default.
        PRECISION="ieee" if query.dtype == torch.float32 else None,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return out


@rows_decode.register_fake
def _(query, keys, values, lengths, scale):
    return torch.empty_like(query, memory_format=torch.contiguous_format)
