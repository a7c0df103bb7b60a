"""The chunked linear cross-entropy (compiled loss terms on CUDA) against full-logit autograd."""

import pytest
import torch
from torch.nn import functional as F

from pipeline.objective import linear_ce
from pipeline.objective.linear_ce import linear_cross_entropy
from pipeline.objective.loss import chunked_loss

HIDDEN = 256


@pytest.fixture(scope="module")
def sizes(device):
    """(vocab, chunk, row counts): the real scale on CUDA, small enough for 2 CPU cores."""
    if device == "cuda":
        return 32000, 1024, (3001, 1537, 4100)
    return 2000, 128, (301, 154, 410)
# dtype -> (relative error of the loss, relative error (norm) of the gradient, hit agreement)
TOLERANCE = {torch.float32: (1e-5, 1e-4, 0.999), torch.bfloat16: (5e-3, 2e-2, 0.98)}


def reference(hidden, weight, labels, weights):
    """The obvious computation: fp32 logits of every row, F.cross_entropy, weighted sum."""
    logits = hidden.float() @ weight.float().t()
    ce = F.cross_entropy(logits, labels, reduction="none")
    return (ce * weights).sum(), logits.argmax(-1) == labels


def inputs(rows, vocab, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    weight = (torch.randn(vocab, HIDDEN, generator=g, device=device) * HIDDEN ** -0.5).to(dtype)
    hidden = torch.randn(rows, HIDDEN, generator=g, device=device).to(dtype)
    # Labels near the argmax for some rows, so that hits are neither all nor none.
    labels = torch.randint(0, vocab, (rows,), generator=g, device=device)
    top = (hidden[: rows // 4].float() @ weight.float().t()).argmax(-1)
    labels[: rows // 4] = top
    weights = torch.rand(rows, generator=g, device=device)
    return hidden, weight, labels, weights


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_chunked_ce_matches_full_logits(device, on_cuda, sizes, dtype):
    vocab, chunk, row_counts = sizes
    loss_tol, grad_tol, hit_tol = TOLERANCE[dtype]
    # Row counts that change between calls (the terms are compiled with dynamic shapes) and
    # that are not multiples of the chunk.
    for rows in row_counts:
        hidden, weight, labels, weights = inputs(rows, vocab, dtype, device, seed=rows)
        weight.requires_grad_(True)
        ours_h = hidden.clone().requires_grad_(True)
        ref_h = hidden.clone().requires_grad_(True)
        num, hits = linear_cross_entropy(ours_h, weight, labels, weights, chunk)
        ref, ref_hits = reference(ref_h, weight.detach(), labels, weights)
        (3.0 * num).backward()  # a non-unit upstream gradient must scale the stored one
        (3.0 * ref).backward()
        assert num.dtype == torch.float32 and ours_h.grad.dtype == dtype
        num, ref = num.detach(), ref.detach()
        assert abs(float(num) - float(ref)) <= loss_tol * abs(float(ref)), (float(num), float(ref))
        assert rel(ours_h.grad, ref_h.grad) < grad_tol
        assert float((hits == ref_hits).float().mean()) >= hit_tol
        assert 0.1 < float(ref_hits.float().mean()) < 0.5  # the hit check is not vacuous
        assert weight.grad is None  # the head is frozen
    if on_cuda:
        assert linear_ce._compiled_terms is not None  # the compiled kernel did the work


def test_chunked_loss_matches_reference_per_position(device, sizes):
    """loss.chunked_loss: only supervised rows count; correct/total per block position."""
    vocab, chunk, _ = sizes
    n, blocks, block_size = 3, 40, 8
    q_len = blocks * block_size
    torch.manual_seed(0)
    hidden = torch.randn(n, q_len, HIDDEN, device=device, dtype=torch.bfloat16)
    _, weight, _, _ = inputs(1, vocab, torch.bfloat16, device, seed=1)
    labels = torch.randint(0, vocab, (n, q_len), device=device)
    labels[:, ::3] = (hidden[:, ::3].float() @ weight.float().t()).argmax(-1)
    supervised = torch.rand(n, q_len, device=device) < 0.7
    supervised[:, ::block_size] = False  # anchors are never scored
    weights = torch.rand(n, q_len, device=device) * supervised
    ours_h = hidden.clone().requires_grad_(True)
    ref_h = hidden.clone().requires_grad_(True)
    parts = chunked_loss(ours_h, weight, labels, weights, supervised, block_size, chunk)
    parts.numerator.backward()
    logits = ref_h.float() @ weight.float().t()
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(n, q_len)
    (ce * weights).sum().backward()
    ref = float((ce * weights).sum().detach())
    assert abs(float(parts.numerator.detach()) - ref) <= 5e-3 * ref
    torch.testing.assert_close(parts.denominator, weights.sum(), rtol=1e-5, atol=1e-5)
    assert rel(ours_h.grad, ref_h.grad) < 2e-2
    assert torch.all(ours_h.grad.flatten(0, 1)[~supervised.flatten()] == 0)
    pos = torch.arange(q_len, device=device) % block_size
    hit = (logits.argmax(-1) == labels) & supervised
    total = torch.stack([supervised[:, pos == k].sum() for k in range(block_size)]).float()
    correct = torch.stack([hit[:, pos == k].sum() for k in range(block_size)]).float()
    torch.testing.assert_close(parts.total, total)
    # bf16 logits flip a few near-ties at the argmax; a wrong position or count is far off.
    assert float((parts.correct - correct).abs().sum()) <= 0.05 * float(correct.sum())
    assert float(correct.sum()) > 0.1 * float(total.sum())
