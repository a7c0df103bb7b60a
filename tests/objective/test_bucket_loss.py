"""A bucketed micro-batch trains exactly what its samples do one by one."""

import dataclasses

import pytest
import torch

from pipeline.data import Sample, collate
from pipeline.objective.step import Objective, drafter_loss

WIDTH = 32  # the bucket's length: every sample is padded to it


def _samples(lengths, seed=5):
    g = torch.Generator().manual_seed(seed)
    out = []
    for sid, n in zip((11, 42, 7), lengths):
        mask = torch.zeros(n, dtype=torch.long)
        mask[n // 4:] = 1  # a prompt, then the supervised answer
        out.append(Sample(sid, torch.randint(0, 90, (n,), generator=g), mask))
    return out


@pytest.fixture()
def setup(drafter_setup):
    drafter, target, head, spec, options = drafter_setup
    # 20 anchors: a 17-token sample alone pads them to 17, the 32-token bucket to 20.
    objective = dataclasses.replace(Objective.from_config(spec, options), static_shapes=True,
                                    num_anchors=20)
    return drafter, target, head, objective


def _parts(setup, samples, pad_to, row_mask=None):
    """Loss parts of one micro-batch; ``row_mask`` keeps the loss of those rows only."""
    drafter, target, head, objective = setup
    batch = collate(samples, pad_id=0, pad_to=pad_to)
    with torch.no_grad():
        features = target(batch.input_ids)
    anchors = objective.anchors(batch.loss_mask, batch.sample_ids, seed=0, epoch=1)
    assert anchors.num_blocks == min(objective.num_anchors, batch.input_ids.shape[1])
    loss_mask = batch.loss_mask if row_mask is None else batch.loss_mask * row_mask[:, None]
    return drafter_loss(drafter, head, objective, features, batch.input_ids, loss_mask, anchors)


def _grads(drafter, loss):
    drafter.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in drafter.parameters()]


def test_bucketed_batch_equals_its_samples_one_by_one(setup):
    drafter = setup[0]
    samples = _samples([17, 32, 23])
    batch = _parts(setup, samples, WIDTH)
    singles = [_parts(setup, [s], None) for s in samples]  # each at its own length
    num = sum(p.numerator for p in singles)
    den = sum(float(p.denominator) for p in singles)
    assert float(batch.denominator) == pytest.approx(den, rel=1e-6) and den > 0
    assert float(batch.numerator.detach()) == pytest.approx(float(num.detach()), rel=1e-5)
    torch.testing.assert_close(batch.correct, sum(p.correct for p in singles))
    torch.testing.assert_close(batch.total, sum(p.total for p in singles))
    # The update: sum(gradients of numerators) / sum(denominators), as the step divides.
    want = _grads(drafter, num / den)
    got = _grads(drafter, batch.numerator / batch.denominator)
    assert any(g.abs().sum() > 0 for g in got)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@torch.no_grad()
def test_perturbing_one_sample_leaves_the_others_alone(setup):
    samples = _samples([17, 32, 23])
    changed = list(samples)
    ids = samples[1].input_ids.clone()
    ids[5:] = (ids[5:] + 1) % 90
    changed[1] = dataclasses.replace(samples[1], input_ids=ids)
    for row in range(3):
        keep = torch.zeros(3, dtype=torch.long)
        keep[row] = 1
        before = _parts(setup, samples, WIDTH, keep)
        after = _parts(setup, changed, WIDTH, keep)
        if row == 1:
            assert not torch.isclose(before.numerator, after.numerator)
        else:
            torch.testing.assert_close(after.numerator, before.numerator, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(after.denominator, before.denominator)
            torch.testing.assert_close(after.correct, before.correct)
