"""Flex attention over changing sequence lengths: few compiles, no eager fallback, fused memory.

With ``drafter.static_shapes=false`` every micro-batch brings a new context length S and anchor
count A. A kernel compiled per shape passes dynamo's recompile_limit (8) after a few batches and
then runs flex's eager reference path, which materialises [N, heads, Q, S+Q] scores (an OOM at
the 8B shape). ``fail_on_recompile_limit_hit`` turns that silent fallback into an error here.
"""

import pytest
import torch
from torch._dynamo.utils import counters

from pipeline.model.config import DrafterConfig, build_drafter_spec
from pipeline.model.drafter import DFlashDrafter, attend
from pipeline.objective.masks import build_mask

BLOCK = 4
# 12 (context length, anchors) pairs, more than the recompile limit; A * BLOCK >= 128 (compiled
# flex in torch 2.11 finds no kernel config for fewer queries than one 128-tile).
SHAPES = [(300 + 560 * i, 32 + 46 * i) for i in range(12)]
HEADS, KV_HEADS, HEAD_DIM, N = 32, 8, 64, 2
MAX_COMPILES = 3  # one static graph, one dynamic one, one to spare


@pytest.fixture()
def no_silent_fallback(fresh_dynamo):
    with torch._dynamo.config.patch(recompile_limit=8, fail_on_recompile_limit_hit=True):
        yield


def anchors_for(n, context_len, num_anchors, device, seed):
    g = torch.Generator().manual_seed(seed)
    picks = [torch.randperm(context_len - 1, generator=g)[:num_anchors] + 1 for _ in range(n)]
    return torch.sort(torch.stack(picks), dim=1).values.to(device)


def qkv(context_len, num_anchors, device, seed, grad):
    g = torch.Generator(device=device).manual_seed(seed)
    q_len = num_anchors * BLOCK
    shapes = [(N, HEADS, q_len, HEAD_DIM)] + [(N, KV_HEADS, context_len + q_len, HEAD_DIM)] * 2
    return [torch.randn(s, generator=g, device=device, dtype=torch.bfloat16).requires_grad_(grad)
            for s in shapes]


def fwd_bwd(q, k, v, mask, with_grad=True):
    out = attend(q, k, v, mask, HEAD_DIM ** -0.5)
    if not with_grad:
        return out.detach(), None
    grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    return out.detach(), grads


def test_flex_kernel_serves_changing_lengths_with_few_compiles(device, on_cuda, no_silent_fallback):
    # Flex attention has no CPU backward; on CPU only the values are checked, on small shapes.
    shapes = SHAPES if on_cuda else [(s // 8, a // 8) for s, a in SHAPES[:4]]
    graphs_before = counters["stats"]["unique_graphs"]
    for i, (context_len, num_anchors) in enumerate(shapes):
        anchors = anchors_for(N, context_len, num_anchors, device, seed=i)
        q, k, v = qkv(context_len, num_anchors, device, seed=i, grad=on_cuda)
        flex = build_mask(anchors, context_len, BLOCK, "flex")
        if i in (0, 1, 3):  # the static graph, the first dynamic one, the dynamic one reused
            out, grads = fwd_bwd(q, k, v, flex, on_cuda)
            dense = build_mask(anchors, context_len, BLOCK, "sdpa")
            ref_out, ref_grads = fwd_bwd(*(t.float() for t in (q, k, v)), dense, on_cuda)
            torch.testing.assert_close(out.float(), ref_out, rtol=2e-2, atol=2e-2)
            for grad, ref in zip(grads or (), ref_grads or ()):
                err = (grad.float() - ref).norm() / ref.norm()
                assert err < 2e-2, f"shape {i}: relative gradient error {float(err):.3g}"
        elif i < len(shapes) - 1:
            fwd_bwd(q, k, v, flex, on_cuda)
        else:
            check_fused_memory(q, k, v, flex, on_cuda)
    if on_cuda:
        compiles = counters["stats"]["unique_graphs"] - graphs_before
        assert 1 <= compiles <= MAX_COMPILES, f"{compiles} compiles over {len(shapes)} shapes"


def check_fused_memory(q, k, v, mask, on_cuda):
    """The largest shape: fp32 scores would be > 4 GB; the fused kernel needs a fraction."""
    n, heads, q_len, _ = q.shape
    if not on_cuda:
        return
    scores_bytes = n * heads * q_len * k.shape[2] * 4
    assert scores_bytes > 4 * 2 ** 30
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fwd_bwd(q, k, v, mask)
    torch.cuda.synchronize()
    used = torch.cuda.max_memory_allocated() - base
    assert used < scores_bytes / 16, f"peak {used / 2 ** 20:.0f} MiB: scores were materialised"


def drafter_model(device):
    """A 2-layer drafter with head_dim 64 (flex's Triton kernels need >= 16)."""
    target = {"model_type": "qwen3", "vocab_size": 128, "hidden_size": 256, "intermediate_size": 512,
              "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "attention_bias": False, "hidden_act": "silu",
              "tie_word_embeddings": False}
    options = DrafterConfig(num_layers=2, block_size=BLOCK, num_taps=3, mask_token_id=127,
                            attention="flex")
    spec = build_drafter_spec(target, options)
    torch.manual_seed(0)
    return DFlashDrafter(spec).to(device), spec


def drafter_inputs(spec, context_len, num_anchors, device, seed):
    g = torch.Generator().manual_seed(seed)
    anchors = anchors_for(1, context_len, num_anchors, "cpu", seed).repeat(2, 1)
    features = torch.randn(2, context_len, spec.feature_size, generator=g)
    embeds = torch.randn(2, num_anchors * BLOCK, spec.hidden_size, generator=g)
    block_pos = (anchors[:, :, None] + torch.arange(BLOCK)).flatten(1)
    ctx_pos = torch.arange(context_len).expand(2, -1)
    return [t.to(device) for t in (features, embeds, ctx_pos, block_pos, anchors)]


def test_compiled_drafter_over_changing_lengths(device, on_cuda, no_silent_fallback):
    """As DrafterTrainer compiles it with static_shapes=false: torch.compile(dynamic=None)."""
    model, spec = drafter_model(device)
    model.requires_grad_(on_cuda)  # flex attention has no CPU backward
    # Inductor's CPU flex template does not build (torch 2.13); CPU checks dynamo's side only.
    compiled = torch.compile(model, dynamic=None, backend="inductor" if on_cuda else "aot_eager")
    shapes = [(s // 4, a) for s, a in SHAPES] if on_cuda else [(96, 32), (130, 40), (161, 33)]
    graphs_before = counters["stats"]["unique_graphs"]
    for i, (context_len, num_anchors) in enumerate(shapes):
        features, embeds, ctx_pos, block_pos, anchors = drafter_inputs(
            spec, context_len, num_anchors, device, seed=i)
        flex = build_mask(anchors, context_len, BLOCK, "flex")
        with torch.autocast(device, dtype=torch.bfloat16):
            hidden = compiled(features, embeds, ctx_pos, block_pos, flex)
        if on_cuda:
            hidden.float().square().mean().backward()
        if i in (0, 2):
            with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
                ref = model(features, embeds, ctx_pos, block_pos,
                            build_mask(anchors, context_len, BLOCK, "sdpa"))
            torch.testing.assert_close(hidden.detach().float(), ref.float(), rtol=3e-2, atol=3e-2)
    if on_cuda:
        grads = [p.grad for p in model.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
    compiles = counters["stats"]["unique_graphs"] - graphs_before
    assert 1 <= compiles <= MAX_COMPILES, f"{compiles} compiles over {len(shapes)} shapes"
