"""Masks by perturbation, train == inference, the loss against a plain loop."""

import math

import pytest
import torch
from torch.nn import functional as F

from pipeline.eval.speculative import DrafterProposer
from pipeline.model.drafter import embed_tokens
from pipeline.objective.anchors import Anchors, sample_anchors, valid_anchor_positions
from pipeline.objective.blocks import build_blocks
from pipeline.objective.masks import build_mask
from pipeline.objective.step import Objective, drafter_loss

B = 4
MASK = 95


def block_logits(drafter, head, features, ids, anchors, attention="sdpa"):
    """Training forward: all blocks in one pass -> logits [N, A*B, V]."""
    n, s = ids.shape
    blocks = build_blocks(ids, torch.ones_like(ids), anchors, B, MASK, 7.0)
    mask = build_mask(anchors.positions, s, B, attention)
    hidden = drafter(features, embed_tokens(head.embed, blocks.token_ids),
                     torch.arange(s).expand(n, s), blocks.positions, mask)
    return hidden @ head.lm_head.t()


def scored_positions(anchors, ids, loss_mask, block_size):
    """(row, block, anchor position, block position k) of every scored position, by the plain
    rule: k >= 1, the block kept, token a + k in the row and supervised."""
    for r in range(ids.shape[0]):
        for j in range(anchors.num_blocks):
            a = int(anchors.positions[r, j])
            for k in range(1, block_size):
                if anchors.keep[r, j] and a + k < ids.shape[1] and loss_mask[r, a + k]:
                    yield r, j, a, k


def fixed_anchors(*rows):
    pos = torch.tensor(rows)
    return Anchors(pos, torch.ones_like(pos, dtype=torch.bool))


@pytest.fixture()
def batch(drafter_setup):
    drafter, target, head, _, _ = drafter_setup
    torch.manual_seed(3)
    ids = torch.randint(0, 90, (2, 24))
    features = torch.randn(2, 24, 96)
    return drafter, head, features, ids


@torch.no_grad()
def test_changes_at_or_after_anchor_do_not_leak(batch):
    drafter, head, features, ids = batch
    anchors = fixed_anchors([5, 11, 17], [3, 9, 20])
    base = block_logits(drafter, head, features, ids, anchors)
    for row, blk, a in [(0, 1, 11), (1, 0, 3)]:
        feats = features.clone()
        feats[row, a:] += torch.randn_like(feats[row, a:]) * 5  # the anchor's own and later
        out = block_logits(drafter, head, feats, ids, anchors)
        sl = slice(blk * B, (blk + 1) * B)
        torch.testing.assert_close(out[row, sl], base[row, sl])
        # Context strictly before the anchor is visible: changing it must change the block.
        feats = features.clone()
        feats[row, a - 1] += 5.0
        assert not torch.allclose(block_logits(drafter, head, feats, ids, anchors)[row, sl],
                                  base[row, sl])


@torch.no_grad()
def test_other_blocks_tokens_do_not_leak(batch):
    drafter, head, features, ids = batch
    anchors = fixed_anchors([5, 11, 17], [3, 9, 20])
    base = block_logits(drafter, head, features, ids, anchors)
    changed = ids.clone()
    changed[0, 11] = (changed[0, 11] + 1) % 90  # the anchor token of block 1 only
    out = block_logits(drafter, head, features, changed, anchors)
    torch.testing.assert_close(out[0, :B], base[0, :B])
    torch.testing.assert_close(out[0, 2 * B:], base[0, 2 * B:])
    assert not torch.allclose(out[0, B:2 * B], base[0, B:2 * B])


@torch.no_grad()
def test_train_forward_equals_inference_forward(batch):
    drafter, head, features, ids = batch
    gen = torch.Generator().manual_seed(0)
    proposer = DrafterProposer(drafter, head)
    for _ in range(3):
        rows = [sorted(torch.randperm(22, generator=gen)[:4].add(1).tolist()) for _ in range(2)]
        anchors = fixed_anchors(*rows)
        train = block_logits(drafter, head, features, ids, anchors)
        for r, row in enumerate(rows):
            for j, a in enumerate(row):
                infer = proposer.block_hidden(features[r:r + 1, :a], int(ids[r, a]), a)
                infer = infer @ head.lm_head.t()
                torch.testing.assert_close(train[r, j * B + 1:(j + 1) * B], infer,
                                           rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_flex_and_sdpa_give_same_logits(batch):
    drafter, head, features, ids = batch
    anchors = fixed_anchors([5, 11, 17], [3, 9, 0])
    anchors.keep[1, 2] = False
    dense = block_logits(drafter, head, features, ids, anchors, "sdpa")
    flex = block_logits(drafter, head, features, ids, anchors, "flex")
    torch.testing.assert_close(flex, dense, rtol=1e-4, atol=1e-4)


def test_loss_equals_per_position_loop(drafter_setup, batch):
    drafter, head, features, ids = batch
    _, _, _, spec, options = drafter_setup
    objective = Objective.from_config(spec, options)
    loss_mask = torch.zeros_like(ids)
    loss_mask[0, 4:20] = 1
    loss_mask[1, 8:] = 1
    anchors = objective.anchors(loss_mask, [10, 11], seed=0, epoch=0)
    parts = drafter_loss(drafter, head, objective, features, ids, loss_mask, anchors)
    logits = block_logits(drafter, head, features, ids, anchors)
    num = den = 0.0
    correct = torch.zeros(B)
    for r, j, a, k in scored_positions(anchors, ids, loss_mask, B):
        w = math.exp(-(k - 1) / objective.gamma)
        lg = logits[r, j * B + k]
        num += w * F.cross_entropy(lg[None], ids[r, a + k][None]).item()
        den += w
        correct[k] += float(lg.argmax() == ids[r, a + k])
    assert den > 0
    assert parts.numerator.item() == pytest.approx(num, rel=1e-5)
    assert parts.denominator.item() == pytest.approx(den, rel=1e-6)
    torch.testing.assert_close(parts.correct, correct)
    parts.numerator.backward()
    assert drafter.fc.weight.grad.abs().sum() > 0


def test_anchors_valid_deterministic_and_seeded_by_sample_id():
    loss_mask = torch.zeros(3, 40, dtype=torch.long)
    loss_mask[:, 10:30] = 1
    loss_mask[2, 20] = 0
    a = sample_anchors(loss_mask, [7, 8, 9], num_anchors=5, seed=1, epoch=0)
    b = sample_anchors(loss_mask[[1, 0]], [8, 7], num_anchors=5, seed=1, epoch=0)
    torch.testing.assert_close(a.positions[[1, 0]], b.positions)  # batch order is irrelevant
    assert not torch.equal(a.positions[0], a.positions[1])        # ids differ -> anchors differ
    c = sample_anchors(loss_mask, [7, 8, 9], num_anchors=5, seed=1, epoch=1)
    assert not torch.equal(a.positions, c.positions)
    for row in range(3):
        valid = set(valid_anchor_positions(loss_mask[row]).tolist())
        picked = a.positions[row][a.keep[row]].tolist()
        assert picked == sorted(picked) and set(picked) <= valid and len(set(picked)) == 5
    assert 19 not in valid_anchor_positions(loss_mask[2]).tolist()  # 20 is not supervised
    few = sample_anchors(loss_mask, [7, 8, 9], num_anchors=50, seed=1, epoch=0, pad_to=60)
    assert few.keep.sum(1).tolist() == [19, 19, 17] and few.positions.shape == (3, 60)


@torch.no_grad()
def test_flex_pads_to_128_queries_with_blocks_that_weigh_nothing(drafter_setup):
    """Compiled flex has no kernel under 128 queries: a flex objective pads its anchor blocks
    to 128 / B, and the loss is the unpadded (sdpa) one."""
    import dataclasses

    from pipeline.objective.step import FLEX_MIN_QUERIES

    drafter, target, head, spec, options = drafter_setup
    sdpa = Objective.from_config(spec, options)
    flex = dataclasses.replace(sdpa, attention="flex")
    torch.manual_seed(4)
    ids = torch.randint(0, 90, (2, 20))
    loss_mask = torch.zeros_like(ids)
    loss_mask[:, 8:] = 1
    features = target(ids)
    few, padded = (o.anchors(loss_mask, [3, 4], seed=0, epoch=0) for o in (sdpa, flex))
    assert few.num_blocks * B < FLEX_MIN_QUERIES == padded.num_blocks * B
    assert torch.equal(padded.keep.sum(1), few.keep.sum(1))
    parts = [drafter_loss(drafter, head, o, features, ids, loss_mask, a)
             for o, a in ((sdpa, few), (flex, padded))]
    assert float(parts[0].denominator) == float(parts[1].denominator) > 0
    assert float(parts[1].numerator) == pytest.approx(float(parts[0].numerator), rel=1e-5)
    torch.testing.assert_close(parts[1].correct, parts[0].correct)


def test_distilled_loss_equals_per_position_loop(drafter_setup, batch):
    """With distillation the features carry the target's final hidden state after the taps;
    block position k of anchor a is scored against the target's distribution at a + k - 1."""
    import dataclasses

    from pipeline.model.config import DrafterConfig
    from pipeline.objective.linear_ce import Distill

    drafter, head, taps, ids = batch
    _, _, _, spec, options = drafter_setup
    options = dataclasses.replace(options, distill_weight=0.6, distill_temperature=2.0)
    objective = Objective.from_config(spec, options)
    assert objective.distill == Distill(0.6, 2.0) and objective.dpace_alpha is None
    assert Objective.from_config(spec, DrafterConfig(
        position_weights="dpace", dpace_alpha=0.3)).dpace_alpha == 0.3
    final = torch.randn(2, 24, 32, generator=torch.Generator().manual_seed(9))
    loss_mask = torch.zeros_like(ids)
    loss_mask[0, 4:20] = 1
    loss_mask[1, 8:] = 1
    anchors = objective.anchors(loss_mask, [10, 11], seed=0, epoch=0)
    parts = drafter_loss(drafter, head, objective, torch.cat([taps, final], -1), ids,
                         loss_mask, anchors)
    logits = block_logits(drafter, head, taps, ids, anchors)
    lam, temp = 0.6, 2.0
    num = den = 0.0
    for r, j, a, k in scored_positions(anchors, ids, loss_mask, B):
        w = math.exp(-(k - 1) / objective.gamma)
        lg = logits[r, j * B + k][None]
        teacher = final[r, a + k - 1][None] @ head.lm_head.t()
        ce = F.cross_entropy(lg, ids[r, a + k][None]).item()
        kl = F.kl_div(F.log_softmax(lg / temp, -1), F.log_softmax(teacher / temp, -1),
                      reduction="sum", log_target=True).item()
        num += w * ((1 - lam) * ce + lam * temp ** 2 * kl)
        den += w
    assert den > 0
    assert parts.numerator.item() == pytest.approx(num, rel=1e-5)
    assert parts.denominator.item() == pytest.approx(den, rel=1e-6)
    parts.numerator.backward()
    assert drafter.fc.weight.grad.abs().sum() > 0
