"""The chunked linear cross-entropy against plain autograd over full logits."""

import pytest
import torch
from torch.nn import functional as F

from pipeline.objective.linear_ce import linear_cross_entropy


def reference(hidden, weight, labels, weights):
    logits = hidden @ weight.t()
    ce = F.cross_entropy(logits, labels, reduction="none")
    return (ce * weights).sum(), logits.argmax(-1) == labels


@pytest.mark.parametrize("rows,chunk", [(37, 8), (37, 37), (37, 100), (1, 4)])
def test_value_hits_and_gradient_match_autograd(rows, chunk):
    g = torch.Generator().manual_seed(rows * 31 + chunk)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64)
    hidden = torch.randn(rows, 16, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 50, (rows,), generator=g)
    weights = torch.rand(rows, generator=g, dtype=torch.float64)
    h1 = hidden.clone().requires_grad_()
    h2 = hidden.clone().requires_grad_()
    num, hits = linear_cross_entropy(h1, weight, labels, weights, chunk)
    ref, ref_hits = reference(h2, weight, labels, weights)
    (3.0 * num).backward()  # a non-unit upstream gradient must scale the stored one
    (3.0 * ref).backward()
    torch.testing.assert_close(num.double(), ref, rtol=1e-6, atol=1e-5)
    assert torch.equal(hits, ref_hits)
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-6, atol=1e-9)


def test_frozen_head_gets_no_gradient_and_empty_rows_give_zero():
    weight = torch.randn(10, 4, requires_grad=True)
    hidden = torch.randn(3, 4, requires_grad=True)
    num, _ = linear_cross_entropy(hidden, weight, torch.tensor([1, 2, 3]), torch.ones(3), 2)
    num.backward()
    assert weight.grad is None and hidden.grad is not None
    empty = torch.zeros(0, 4, requires_grad=True)
    zero, hits = linear_cross_entropy(empty, weight, torch.zeros(0, dtype=torch.long),
                                      torch.zeros(0), 2)
    assert zero.item() == 0.0 and hits.numel() == 0


def test_an_fp32_head_under_bf16_autocast_keeps_its_precision():
    """Autocast must not recast the head's products: the H200 families test hit a dtype clash
    (bf16 features, fp32 head) in the gradient buffer. Reference: fp32 logits of bf16 rows."""
    torch.manual_seed(0)
    hidden = torch.randn(10, 16, dtype=torch.bfloat16, requires_grad=True)
    head, labels = torch.randn(50, 16), torch.randint(0, 50, (10,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        numerator, _ = linear_cross_entropy(hidden, head, labels, torch.ones(10), 4)
    numerator.backward()
    reference = hidden.detach().float().requires_grad_()
    want = F.cross_entropy(reference @ head.t(), labels, reduction="sum")
    want.backward()
    assert numerator.dtype == torch.float32 and hidden.grad.dtype == torch.bfloat16
    torch.testing.assert_close(numerator, want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(hidden.grad.float(), reference.grad, rtol=1e-2, atol=1e-2)
