"""The chunked per-row losses against plain autograd over full logits."""

import pytest
import torch
from torch.nn import functional as F

from pipeline.objective.linear_ce import Distill, row_losses


def reference(hidden, weight, labels, weights):
    logits = hidden @ weight.t()
    ce = F.cross_entropy(logits, labels, reduction="none")
    return (ce * weights).sum(), logits.argmax(-1) == labels


def weighted(hidden, weight, labels, weights, chunk, teacher=None, distill=None):
    rows = row_losses(hidden, weight, labels, chunk, teacher, distill)
    return (weights * rows.loss).sum(), rows


@pytest.mark.parametrize("rows,chunk", [(37, 8), (37, 37), (37, 100), (1, 4)])
def test_value_hits_and_gradient_match_autograd(rows, chunk):
    g = torch.Generator().manual_seed(rows * 31 + chunk)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64)
    hidden = torch.randn(rows, 16, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 50, (rows,), generator=g)
    weights = torch.rand(rows, generator=g, dtype=torch.float64)
    h1 = hidden.clone().requires_grad_()
    h2 = hidden.clone().requires_grad_()
    num, parts = weighted(h1, weight, labels, weights, chunk)
    ref, ref_hits = reference(h2, weight, labels, weights)
    (3.0 * num).backward()  # a non-unit upstream gradient must scale the stored one
    (3.0 * ref).backward()
    torch.testing.assert_close(num, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(parts.ce, parts.loss.detach())  # CE alone: the same values
    assert torch.equal(parts.hits, ref_hits)
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-10, atol=1e-12)


def naive_distill(hidden, teacher, weight, labels, weights, lam, temp):
    """Full logits, F.cross_entropy and F.kl_div: (1 - lam) CE + lam T^2 KL(p_T || q_T)."""
    logits, target = hidden @ weight.t(), teacher @ weight.t()
    ce = F.cross_entropy(logits, labels, reduction="none")
    kl = F.kl_div(F.log_softmax(logits / temp, -1), F.log_softmax(target / temp, -1),
                  reduction="none", log_target=True).sum(-1)
    loss = (1 - lam) * ce + lam * temp ** 2 * kl
    return (weights * loss).sum(), ce


@pytest.mark.parametrize("lam,temp", [(0.3, 1.0), (0.7, 2.5), (1.0, 0.5)])
def test_distillation_matches_full_logit_kl_with_temperature(lam, temp):
    rows, chunk = 29, 6  # chunks smaller than the rows, the last one short
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(40, 12, generator=g, dtype=torch.float64)
    hidden = torch.randn(rows, 12, generator=g, dtype=torch.float64)
    teacher = torch.randn(rows, 12, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 40, (rows,), generator=g)
    weights = torch.rand(rows, generator=g, dtype=torch.float64)
    h1 = hidden.clone().requires_grad_()
    h2 = hidden.clone().requires_grad_()
    num, parts = weighted(h1, weight, labels, weights, chunk, teacher, Distill(lam, temp))
    ref, ref_ce = naive_distill(h2, teacher, weight, labels, weights, lam, temp)
    (2.0 * num).backward()
    (2.0 * ref).backward()
    torch.testing.assert_close(num, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(parts.ce, ref_ce.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-10, atol=1e-12)
    # Not vacuous: the KL term moves both the value and the gradient away from CE alone.
    ce_only, _ = reference(hidden, weight, labels, weights)
    assert abs(float(num.detach()) - float(ce_only)) > 1e-3


def test_a_target_that_agrees_with_the_draft_adds_no_kl():
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(30, 8, generator=g, dtype=torch.float64)
    hidden = torch.randn(5, 8, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 30, (5,), generator=g)
    parts = row_losses(hidden, weight, labels, 2, hidden.clone(), Distill(1.0, 2.0))
    torch.testing.assert_close(parts.loss, torch.zeros(5, dtype=torch.float64),
                               rtol=0, atol=1e-12)


def test_frozen_head_gets_no_gradient_and_empty_rows_give_zero():
    weight = torch.randn(10, 4, requires_grad=True)
    hidden = torch.randn(3, 4, requires_grad=True)
    num, _ = weighted(hidden, weight, torch.tensor([1, 2, 3]), torch.ones(3), 2)
    num.backward()
    assert weight.grad is None and hidden.grad is not None
    empty = torch.zeros(0, 4, requires_grad=True)
    zero, parts = weighted(empty, weight, torch.zeros(0, dtype=torch.long), torch.zeros(0), 2)
    zero.backward()
    assert zero.item() == 0.0 and parts.hits.numel() == 0 and parts.ce.numel() == 0


def test_an_fp32_head_under_bf16_autocast_keeps_its_precision():
    """Autocast must not recast the head's products: the H200 families test hit a dtype clash
    (bf16 features, fp32 head) in the gradient buffer. Reference: fp32 logits of bf16 rows."""
    torch.manual_seed(0)
    hidden = torch.randn(10, 16, dtype=torch.bfloat16, requires_grad=True)
    head, labels = torch.randn(50, 16), torch.randint(0, 50, (10,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        numerator, _ = weighted(hidden, head, labels, torch.ones(10), 4)
    numerator.backward()
    reference = hidden.detach().float().requires_grad_()
    want = F.cross_entropy(reference @ head.t(), labels, reduction="sum")
    want.backward()
    assert numerator.dtype == torch.float32 and hidden.grad.dtype == torch.bfloat16
    torch.testing.assert_close(numerator, want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(hidden.grad.float(), reference.grad, rtol=1e-2, atol=1e-2)
