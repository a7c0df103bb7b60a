"""The chunked per-row losses (compiled loss terms on CUDA) against full-logit autograd:
cross-entropy, distillation, and the chunked loss with D-PACE weights."""

import pytest
import torch
from torch.nn import functional as F

from pipeline.objective import linear_ce
from pipeline.objective.dpace import dpace_weights
from pipeline.objective.linear_ce import Distill, row_losses
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


def blocks_batch(n, q_len, block_size, vocab, device, seed, hit_every, share):
    """Block-shaped bf16 rows: every ``hit_every``-th label at the argmax (hits neither all nor
    none), a ``share`` of positions supervised, anchors (each block's first) never."""
    torch.manual_seed(seed)
    hidden = torch.randn(n, q_len, HIDDEN, device=device, dtype=torch.bfloat16)
    _, weight, _, _ = inputs(1, vocab, torch.bfloat16, device, seed=1)
    labels = torch.randint(0, vocab, (n, q_len), device=device)
    top = hidden[:, ::hit_every].float() @ weight.float().t()
    labels[:, ::hit_every] = top.argmax(-1)
    supervised = torch.rand(n, q_len, device=device) < share
    supervised[:, ::block_size] = False
    return hidden, weight, labels, supervised


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
        rows_out = row_losses(ours_h, weight, labels, chunk)
        num, hits = (weights * rows_out.loss).sum(), rows_out.hits
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
        assert "ce" in linear_ce._compiled  # the compiled kernel did the work


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_chunked_distillation_matches_full_logits(device, on_cuda, sizes, dtype):
    """(1 - lambda) CE + lambda T^2 KL(p_T || q_T), the target's logits from its final hidden
    rows through the same head, chunk by chunk; row counts change between calls."""
    vocab, chunk, row_counts = sizes
    loss_tol, grad_tol, _ = TOLERANCE[dtype]
    lam, temp = 0.5, 2.0
    for rows in row_counts:
        hidden, weight, labels, weights = inputs(rows, vocab, dtype, device, seed=rows)
        teacher = (hidden.float() + 0.5 * torch.randn_like(hidden.float())).to(dtype)
        ours_h = hidden.clone().requires_grad_(True)
        ref_h = hidden.clone().requires_grad_(True)
        out = row_losses(ours_h, weight, labels, chunk, teacher, Distill(lam, temp))
        num = (weights * out.loss).sum()
        logits = ref_h.float() @ weight.float().t()
        target = teacher.float() @ weight.float().t()
        kl = F.kl_div(F.log_softmax(logits / temp, -1), F.log_softmax(target / temp, -1),
                      reduction="none", log_target=True).sum(-1)
        ce = F.cross_entropy(logits, labels, reduction="none")
        ref = (weights * ((1 - lam) * ce + lam * temp ** 2 * kl)).sum()
        (3.0 * num).backward()
        (3.0 * ref).backward()
        assert num.dtype == torch.float32 and ours_h.grad.dtype == dtype
        num, ref = num.detach(), ref.detach()
        assert abs(float(num) - float(ref)) <= loss_tol * abs(float(ref))
        assert rel(out.ce, ce.detach()) < loss_tol
        assert rel(ours_h.grad, ref_h.grad) < grad_tol
    if on_cuda:
        assert "distill" in linear_ce._compiled


def test_chunked_loss_with_dpace_matches_reference(device, sizes):
    """D-PACE weights from the chunked CE: the same weights as from full-logit CE, and the
    gradient of sum(w.detach() * CE)."""
    vocab, chunk, _ = sizes
    n, blocks, block_size = 3, 40, 8
    q_len = blocks * block_size
    hidden, weight, labels, supervised = blocks_batch(n, q_len, block_size, vocab, device,
                                                      seed=2, hit_every=2, share=0.9)
    ours_h = hidden.clone().requires_grad_(True)
    ref_h = hidden.clone().requires_grad_(True)
    parts = chunked_loss(ours_h, weight, labels, supervised.float(), supervised, block_size,
                         chunk, dpace_alpha=0.5)
    parts.numerator.backward()
    logits = ref_h.float() @ weight.float().t()
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(n, q_len)
    w = dpace_weights(ce.detach().view(n, blocks, block_size),
                      supervised.view(n, blocks, block_size), 0.5).view(n, q_len)
    (w * ce).sum().backward()
    assert rel(parts.denominator, w.sum()) < 1e-2
    assert abs(float(parts.numerator.detach()) - float((w * ce).sum())) <= 1e-2 * float(
        (w * ce).sum())
    assert rel(ours_h.grad, ref_h.grad) < 3e-2


def test_chunked_loss_matches_reference_per_position(device, sizes):
    """loss.chunked_loss: only supervised rows count; correct/total per block position."""
    vocab, chunk, _ = sizes
    n, blocks, block_size = 3, 40, 8
    q_len = blocks * block_size
    hidden, weight, labels, supervised = blocks_batch(n, q_len, block_size, vocab, device,
                                                      seed=0, hit_every=3, share=0.7)
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
