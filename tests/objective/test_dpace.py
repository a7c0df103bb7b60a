"""D-PACE position weights against a plain loop, and the loss they weigh against full logits."""

import math

import pytest
import torch
from torch.nn import functional as F

from pipeline.objective.dpace import dpace_weights
from pipeline.objective.loss import chunked_loss


def loop_weights(ce, supervised, alpha):
    """One block: w_j = sum_{m=j}^{B-1} prod_{k=1}^{m} q~_k, the chain ending at the first
    unsupervised position k >= 1 (nothing after it is ever accepted)."""
    size = len(ce)
    w = [0.0] * size
    for j in range(1, size):
        for m in range(j, size):
            if not all(supervised[k] for k in range(1, m + 1)):
                break
            w[j] += math.prod(alpha + (1 - alpha) * math.exp(-ce[k]) for k in range(1, m + 1))
    return w


def test_a_block_by_hand():
    # q = exp(-ce) = 1/2, 1, 1/4 at positions 1..3; alpha 1/2: q~ = 3/4, 1, 5/8;
    # C = 3/4, 3/4, 15/32; w_j = C_j + ... + C_3.
    ce = torch.tensor([[9.0, math.log(2), 0.0, math.log(4)]], dtype=torch.float64)
    every = torch.tensor([[False, True, True, True]])
    got = dpace_weights(ce, every, 0.5)
    torch.testing.assert_close(got, torch.tensor([[0.0, 1.96875, 1.21875, 0.46875]],
                                                 dtype=torch.float64))
    # Position 2 unsupervised: the chain ends there, so position 3 weighs nothing either.
    cut = torch.tensor([[False, True, False, True]])
    torch.testing.assert_close(dpace_weights(ce, cut, 0.5),
                               torch.tensor([[0.0, 0.75, 0.0, 0.0]], dtype=torch.float64))
    # alpha 1: every q~ is 1, w_j = B - j, whatever the confidences.
    torch.testing.assert_close(dpace_weights(ce, every, 1.0),
                               torch.tensor([[0.0, 3.0, 2.0, 1.0]], dtype=torch.float64))


def test_weights_match_the_loop_on_cut_tail_and_padded_blocks():
    g = torch.Generator().manual_seed(0)
    size = 6
    ce = torch.rand(2, 4, size, generator=g, dtype=torch.float64) * 4
    supervised = torch.ones(2, 4, size, dtype=torch.bool)
    supervised[..., 0] = False                    # anchors are never scored
    supervised[0, 1, 3] = False                   # supervision resumes after a gap: cut at 3
    supervised[0, 2, 4:] = False                  # a block running past the supervised span
    supervised[1, 0] = False                      # a padding block (keep=False)
    supervised[1, 3, 1] = False                   # cut at once: the whole block weighs 0
    for alpha in (0.5, 0.2, 1.0):
        got = dpace_weights(ce, supervised, alpha)
        for n in range(2):
            for a in range(4):
                want = loop_weights(ce[n, a].tolist(), supervised[n, a].tolist(), alpha)
                torch.testing.assert_close(got[n, a], torch.tensor(want, dtype=torch.float64),
                                           rtol=1e-12, atol=0)
        assert torch.all(got[~supervised] == 0)
        assert torch.all(got[0, 1, 3:] == 0) and torch.all(got[0, 1, 1:3] > 0)
        assert torch.all(got[1, 0] == 0) and torch.all(got[1, 3] == 0)


def test_loss_gradient_is_that_of_detached_weights_times_full_logit_ce():
    """chunked_loss with D-PACE (float64, chunks smaller than the rows): its numerator and
    gradient are those of sum(w.detach() * CE) over full logits, w = decay x D-PACE."""
    g = torch.Generator().manual_seed(3)
    n, blocks, size, width, vocab, alpha = 2, 5, 4, 8, 30, 0.5
    q = blocks * size
    head = torch.randn(vocab, width, generator=g, dtype=torch.float64)
    hidden = torch.randn(n, q, width, generator=g, dtype=torch.float64)
    labels = torch.randint(0, vocab, (n, q), generator=g)
    supervised = torch.rand(n, q, generator=g) < 0.8
    supervised[:, ::size] = False
    supervised[1, size:2 * size] = False  # a padding block
    static = torch.rand(n, q, generator=g, dtype=torch.float64) * supervised
    ours = hidden.clone().requires_grad_()
    parts = chunked_loss(ours, head, labels, static, supervised, size, chunk_size=7,
                         dpace_alpha=alpha)
    parts.numerator.backward()

    naive = hidden.clone().requires_grad_()
    ce = F.cross_entropy((naive @ head.t()).flatten(0, 1), labels.flatten(),
                         reduction="none").view(n, q)
    chain = torch.tensor([[loop_weights(ce[r, b * size:(b + 1) * size].tolist(),
                                        supervised[r, b * size:(b + 1) * size].tolist(), alpha)
                           for b in range(blocks)] for r in range(n)],
                         dtype=torch.float64).view(n, q)
    w = static * chain
    (w.detach() * ce).sum().backward()
    torch.testing.assert_close(parts.numerator, (w * ce).sum(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(parts.denominator, w.sum(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.grad, naive.grad, rtol=1e-10, atol=1e-12)
    # Not vacuous: the same weights left in the graph would give another gradient.
    attached = hidden.clone().requires_grad_()
    ce2 = F.cross_entropy((attached @ head.t()).flatten(0, 1), labels.flatten(),
                          reduction="none").view(n, blocks, size)
    smoothed = alpha + (1 - alpha) * torch.exp(-ce2[..., 1:])
    reach = torch.cumprod(torch.where(supervised.view(n, blocks, size)[..., 1:], smoothed, 0.0),
                          -1)
    live = torch.cat([torch.zeros(n, blocks, 1, dtype=torch.float64),
                      reach.flip(-1).cumsum(-1).flip(-1)], -1)
    torch.testing.assert_close(live.detach().view(n, q), chain)  # the same weights ...
    (static * live.view(n, q) * ce2.view(n, q)).sum().backward()
    assert not torch.allclose(attached.grad, naive.grad, rtol=1e-3, atol=1e-6)  # ... not grad


@pytest.mark.parametrize("alpha", [0.3, 0.7])
def test_weights_carry_no_gradient(alpha):
    ce = torch.rand(3, 4, requires_grad=True)
    w = dpace_weights(ce, torch.ones(3, 4, dtype=torch.bool), alpha)
    assert not w.requires_grad
