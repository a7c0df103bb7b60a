"""The attention the static decoder runs the model with: SDPA over the row cache, GQA without
copying the cache.

With an explicit mask, transformers' own sdpa path repeats every key/value head for its query
group on CUDA (5.17 always; 5.24 except at one query token): at decode time that copies the
whole cache each layer, each step. Here a decode step folds each group's query heads into the
query-length axis instead (``[rows, kv_heads, group, head_dim]`` against the cache's
``[rows, kv_heads, span, head_dim]``; the ``[rows, 1, 1, span]`` mask broadcasts), and only a
prefill, whose keys are the prompt's own, repeats heads. Registered under one name per
decode-step variant in transformers' attention registry and switched on for the decoder's
calls only (``swapped``):

- ``sdpa``: the decode step through ``F.scaled_dot_product_attention`` (on CUDA in bf16 with a
  float mask: the memory-efficient kernel, which tiles 32-64 queries per block, so with a
  group of 3-4 query heads most of each tile is padding);
- ``matmul``: the decode step as two batched matmuls (scores ``[rows*kv_heads, group, span]``,
  then values) with the softmax in fp32 between them, as transformers' eager attention
  computes it: the cache is read once by each matmul, no tile is padded. Which is faster at
  a given batch is measured (``bench.decode_step``), not assumed;
- ``flex``: the decode step through flex attention with a block mask built from each row's
  position (:func:`decode_block_mask`): a row reads only the key blocks it has filled, where
  the other two read every row's cache up to the furthest row's position (at the 8B shape with
  refills, 56% of what they read was a filled column). Eager on CPU, where flex materialises
  the scores; compiled on CUDA. On an H200 (2026-12-03, torch 2.11) it once gave other tokens
  than generate for rows crossing column 32: the full-block index list was an expanded view
  (stride 0 across rows) where flex's CUDA kernels read a contiguous list. It is materialised
  now (:func:`decode_block_mask`), and on the H200 (2026-12-04) every row equals generate
  (tests/gpu/test_static_decoder_gpu.py). It is not
  the faster step there: on SmolLM2-135M at 2,048 rows, 41.8 ms a step against sdpa's 16.9
  (measured; docs/BENCHMARKS.md), although it reads less of the cache.

- ``varlen``: the decode step through the flash kernel's variable-length form
  (``torch.ops.aten._flash_attention_forward`` with ``seqused_k``): the cache is token-major
  (``RowCache(token_major=True)``), each row one sequence of ``capacity`` slots of which the
  kernel reads the row's own filled length, passed as the step's mask (``[rows, 1, 1, 1]``
  int32, which transformers hands through as any 4D mask). One captured graph serves every
  span. CUDA in fp16/bf16 only (the kernel's); elsewhere the same layout and lengths go
  through SDPA with a mask built from them, so CPU tests check the plumbing and the GPU test
  the kernel.
- ``triton``: as ``varlen`` (the same token-major cache, each row's filled length as the
  mask), the decode step through a Triton kernel of ours (:mod:`pipeline.regen.row_kernel`
  says why: the flash kernel pads each row's few queries to 128-row tiles). CUDA, and CPU
  under Triton's interpreter (``TRITON_INTERPRET=1``: the kernel's CPU test); elsewhere
  varlen's SDPA form.

The cache's ``[:, :, :span]`` slice is a view (strides of the whole capacity): neither variant
copies it, as both kernels take a strided batch with a unit last stride.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from transformers import AttentionInterface

NAMES = {"sdpa": "pipeline_static_rows", "matmul": "pipeline_static_rows_matmul",
         "flex": "pipeline_static_rows_flex", "varlen": "pipeline_static_rows_varlen",
         "triton": "pipeline_static_rows_triton"}
ATTENTIONS = tuple(NAMES)
# The variants whose cache is token-major and whose step mask is each row's filled length:
# one captured graph (and one compiled shape) serves every span.
ROW_LENGTHS = ("varlen", "triton")
NAME = NAMES["sdpa"]
# What pipeline.regenerate offers: "auto" picks triton on CUDA in bf16/fp16 where Triton builds
# its kernel (on an H100, 2026-12-05: its row attention 1.37x varlen's at the Qwen3-8B shape
# and 2.39x at SmolLM2-135M's, the 8B decode step at 512 rows 24.1 ms compiled against
# varlen's 29.2; docs/BENCHMARKS.md), else varlen where the flash kernel runs (SmolLM2-135M
# on the H200 at 4,096 rows: 104.9k tokens/s sustained against sdpa's 85.9k), else sdpa.
AUTO = "auto"
CHOICES = (AUTO, *ATTENTIONS)


def _prefill(query, key, value, scaling):
    """A prefill group: right-padded prompts from column 0, so the causal mask alone is exact
    for every prompt token (its keys are all inside its prompt); only padded queries, whose
    outputs the decoder drops, see padded keys. ``is_causal`` lets SDPA take the flash kernel
    on CUDA, where an explicit mask forces the memory-efficient one over every tile. So the
    prefill's mask (each prompt's length, ``[rows, 1, 1, 1]``, which only carries the group
    past transformers' own mask building) is not read here."""
    group = query.shape[1] // key.shape[1]
    if group > 1:
        key = key.repeat_interleave(group, dim=1)
        value = value.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)


def row_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """``query [b, heads, q, d]``, ``key/value [b, kv_heads, k, d]`` -> ``([b, q, heads, d], None)``."""
    b, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if q_len == 1:
        out = F.scaled_dot_product_attention(query.reshape(b, kv_heads, heads // kv_heads, dim),
                                             key, value, attn_mask=attention_mask, scale=scaling)
        out = out.reshape(b, heads, 1, dim)
    else:
        out = _prefill(query, key, value, scaling)
    return out.transpose(1, 2).contiguous(), None


def row_attention_matmul(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                         **kwargs):
    """As :func:`row_attention`; the decode step as matmul, fp32 softmax, matmul."""
    b, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if q_len != 1:
        out = _prefill(query, key, value, scaling)
        return out.transpose(1, 2).contiguous(), None
    scale = dim ** -0.5 if scaling is None else scaling
    q = query.reshape(b, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * scale  # [b, kv, group, span]
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value).reshape(b, heads, 1, dim)
    return out.transpose(1, 2).contiguous(), None


_compiled_flex = None


def _flex(query):
    """flex_attention, compiled on CUDA (one kernel per span bucket: a new span is a new key
    length, and after the first change dynamo compiles one kernel for every later length)."""
    global _compiled_flex
    if not query.is_cuda:
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=None)
    return _compiled_flex


def decode_block_mask(positions: torch.Tensor, span: int) -> BlockMask:
    """The block mask of one decode step: row ``b`` sees columns ``[0, positions[b]]`` of a
    ``span``-column cache. Key blocks wholly inside that prefix are full (no mask applied), the
    one that holds the row's position is partial, and the rest are skipped: never read.
    Built from device tensors alone, so a captured step rebuilds it from ``positions``."""
    rows, block = positions.shape[0], math.gcd(span, 128)
    blocks = span // block
    filled = positions + 1
    full = torch.clamp(filled // block, max=blocks)
    partial = ((filled % block) > 0) & (full < blocks)
    order = torch.arange(blocks, device=positions.device, dtype=torch.int32)
    # Materialised, not an expanded view: flex's CUDA kernels read the index lists as
    # contiguous [rows, heads, q blocks, kv blocks] (a view of stride 0 across rows sends row
    # b to b * blocks entries past the list: another block, or memory that is no index).
    full_indices = order.expand(rows, 1, 1, blocks).contiguous()
    # The partial block comes first among the partial indices; the rest are never read.
    partial_indices = torch.where(order == 0, full[:, None].to(torch.int32), order)

    def visible(b, h, q, kv):
        return kv <= positions[b]

    return BlockMask.from_kv_blocks(
        partial.to(torch.int32)[:, None, None], partial_indices[:, None, None],
        full.to(torch.int32)[:, None, None], full_indices, BLOCK_SIZE=(128, block),
        mask_mod=visible, seq_lengths=(1, span), compute_q_blocks=False)


def row_attention_flex(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                       **kwargs):
    """As :func:`row_attention`; a decode step's ``attention_mask`` is the step's
    :func:`decode_block_mask` (a prefill's is each prompt's length, see :func:`_prefill`)."""
    if not isinstance(attention_mask, BlockMask):
        out = _prefill(query, key, value, scaling)
        return out.transpose(1, 2).contiguous(), None
    out = _flex(query)(query, key, value, block_mask=attention_mask, scale=scaling,
                       enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _has_seqused_k() -> bool:
    op = getattr(torch.ops.aten, "_flash_attention_forward", None)
    return op is not None and any(a.name == "seqused_k" for a in op.default._schema.arguments)


def _capability(device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(torch.device(device))


def _triton_missing() -> str | None:
    """Why the ``triton`` kernel cannot be built here (None: it can)."""
    try:
        import pipeline.regen.row_kernel  # noqa: F401  (Triton compiles the kernel on first use)
    except ImportError as e:
        return f"{type(e).__name__}: {e}"
    return None


_FLASH_DTYPES = (torch.float16, torch.bfloat16)  # what the flash kernel (varlen) takes


def check_attention(attention: str, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse, in one line, ``varlen`` or ``triton`` on CUDA where its kernel cannot run
    (elsewhere varlen's SDPA form runs, by design, for tests)."""
    on_cuda = torch.device(device).type == "cuda"
    if attention == "triton" and (on_cuda or _interpreting()):
        missing = _triton_missing()  # imports the kernel's module: its op registered
        if missing is not None and on_cuda:
            raise ValueError(f"attention=triton: its kernel cannot be built ({missing}): "
                             "use varlen")
        return
    if attention != "varlen" or not on_cuda:
        return
    if dtype not in _FLASH_DTYPES:
        raise ValueError(f"attention=varlen on CUDA needs a bf16 or fp16 model (the flash "
                         f"kernel's), not {dtype}: use sdpa")
    if not _has_seqused_k():
        raise ValueError(f"attention=varlen: torch {torch.__version__} has no flash kernel "
                         "with per-row key lengths (seqused_k): use sdpa")


def _kernel_runs(attention: str, device_type: str, dtype: torch.dtype) -> bool:
    """Whether a row-length attention's own kernel decodes on this device and dtype (else
    varlen's SDPA form stands in): the flash kernel on CUDA in bf16/fp16 (varlen); the Triton
    kernel on CUDA, and on CPU in fp32 under Triton's interpreter (triton)."""
    if attention == "varlen":
        return device_type == "cuda" and dtype in _FLASH_DTYPES
    return device_type == "cuda" or (_interpreting() and dtype == torch.float32)


_STAND_IN = {
    "varlen": "attention=varlen: its flash kernel runs on CUDA in bf16/fp16 only; here the same "
              "cache and lengths go through SDPA",
    "triton": "attention=triton: its kernel runs on CUDA (or in fp32 under TRITON_INTERPRET=1); "
              "here varlen's SDPA form decodes"}


def stand_in(attention: str, device, dtype: torch.dtype) -> str | None:
    """One line where ``attention``'s kernel does not run on ``device`` and varlen's SDPA form
    (the same cache and lengths) decodes in its stead; None where the kernel runs."""
    if attention not in ROW_LENGTHS or _kernel_runs(attention, torch.device(device).type, dtype):
        return None
    return _STAND_IN[attention]


def resolve_attention(attention: str, device, dtype: torch.dtype) -> str:
    """``attention`` itself, or for ``auto``: on CUDA (Ampere or newer) in bf16/fp16 triton
    where its kernel can be built, else varlen where the flash kernel runs; sdpa elsewhere."""
    if attention != AUTO:
        return attention
    if torch.device(device).type != "cuda" or dtype not in _FLASH_DTYPES:
        return "sdpa"
    if _capability(device) < (8, 0):  # neither kernel serves (flash) or was tried before Ampere
        return "sdpa"
    for choice in ("triton", "varlen"):  # the faster first (H100, 2026-12-05)
        try:
            check_attention(choice, device, dtype)
        except ValueError:
            continue
        return choice
    return "sdpa"


def _varlen_kernel_serves(query: torch.Tensor) -> bool:
    return _kernel_runs("varlen", query.device.type, query.dtype)


def _varlen_kernel(q, k, v, q_starts, k_starts, max_q: int, max_k: int, scale: float,
                   k_lengths):
    """The flash kernel's variable-length form: sequence ``i``'s queries
    ``q[q_starts[i]:q_starts[i+1]]`` attend (non-causally) to its first ``k_lengths[i]`` keys
    from ``k_starts[i]``; ``[total_q, heads, d]`` out."""
    return torch.ops.aten._flash_attention_forward(
        q, k, v, q_starts, k_starts, max_q, max_k, 0.0, False, False, scale=scale,
        seqused_k=k_lengths)[0]


def row_attention_varlen(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                         **kwargs):
    """As :func:`row_attention`; a decode step's ``key``/``value`` are the whole token-major
    buffers ``[rows, capacity, kv_heads, d]`` and its ``attention_mask`` each row's filled
    length (``[rows, 1, 1, 1]`` int32)."""
    b, heads, q_len, dim = query.shape
    if q_len != 1:
        out = _prefill(query, key, value, scaling)
        return out.transpose(1, 2).contiguous(), None
    rows, capacity, kv_heads, _ = key.shape
    lengths = attention_mask.reshape(rows)
    scale = dim ** -0.5 if scaling is None else scaling
    group = heads // kv_heads
    if _varlen_kernel_serves(query):
        # Each kv head's query group folded into the query axis (``group`` queries a row, one
        # head per kv head): a row's keys are read once for its whole group, as the kernel's
        # own decode path does for GQA, where one query a head would read them ``group`` times.
        q = query.reshape(b, kv_heads, group, dim).transpose(1, 2).reshape(b * group, kv_heads, dim)
        starts = torch.arange(rows + 1, device=query.device, dtype=torch.int32)
        out = _varlen_kernel(q, key.view(rows * capacity, kv_heads, dim),
                             value.view(rows * capacity, kv_heads, dim), starts * group,
                             starts * capacity, group, capacity, scale, lengths)
        out = out.reshape(b, group, kv_heads, dim).transpose(1, 2).reshape(b, 1, heads, dim)
        return out, None
    visible = torch.arange(capacity, device=query.device)[None] < lengths[:, None]
    blocked = torch.zeros(visible.shape, dtype=query.dtype, device=query.device)
    blocked = blocked.masked_fill(~visible, torch.finfo(query.dtype).min)
    out = F.scaled_dot_product_attention(
        query.reshape(b, kv_heads, group, dim), key.transpose(1, 2),
        value.transpose(1, 2), attn_mask=blocked[:, None, None], scale=scale)
    return out.reshape(b, heads, 1, dim).transpose(1, 2).contiguous(), None


def _interpreting() -> bool:
    """Whether Triton runs kernels through its interpreter (on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _triton_kernel_serves(query: torch.Tensor) -> bool:
    return _kernel_runs("triton", query.device.type, query.dtype)


def row_attention_triton(module, query, key, value, attention_mask, scaling=None,
                         dropout=0.0, **kwargs):
    """As :func:`row_attention_varlen` (same cache, same lengths), the decode step through
    :func:`pipeline.regen.row_kernel.rows_decode`."""
    b, heads, q_len, dim = query.shape
    if q_len != 1 or not _triton_kernel_serves(query):
        return row_attention_varlen(module, query, key, value, attention_mask, scaling)
    # Registers the op on a first, eager call (an engine's check_attention did already, so
    # a compiled step's trace only finds the module loaded).
    import pipeline.regen.row_kernel  # noqa: F401
    scale = dim ** -0.5 if scaling is None else scaling
    out = torch.ops.pipeline.rows_decode(query[:, :, 0], key, value,
                                         attention_mask.reshape(b), scale)
    return out.view(b, 1, heads, dim), None


AttentionInterface.register(NAMES["sdpa"], row_attention)
AttentionInterface.register(NAMES["matmul"], row_attention_matmul)
AttentionInterface.register(NAMES["flex"], row_attention_flex)
AttentionInterface.register(NAMES["varlen"], row_attention_varlen)
AttentionInterface.register(NAMES["triton"], row_attention_triton)


@contextmanager
def swapped(model, attention: str = "sdpa"):
    """The model's attention set to the ``attention`` variant inside, restored after."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = NAMES[attention]
    try:
        yield
    finally:
        config._attn_implementation = before
