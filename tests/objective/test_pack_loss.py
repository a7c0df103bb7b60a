"""A packed micro-batch (data.batching=pack) trains exactly what its samples do one by one."""

import dataclasses

import pytest
import torch

from transformers import AutoConfig

from pipeline.data import Sample, collate
from pipeline.model.config import build_drafter_spec
from pipeline.model.drafter import DFlashDrafter
from pipeline.model.target import load_target, load_target_head
from pipeline.objective.anchors import Anchors
from pipeline.objective.packing import Packing, pack_anchors, pack_rows
from pipeline.objective.step import Objective, drafter_loss

VOCAB = 96  # the suite's target (tests/conftest.py)
WIDTH = 32  # the bucket's length
PACK = Packing(tokens=4 * WIDTH, anchors=56)  # 4 rows, 3 samples: one empty row, pool tail


def _samples(lengths, seed=5):
    g = torch.Generator().manual_seed(seed)
    out = []
    for sid, n in zip((11, 42, 7), lengths):
        mask = torch.zeros(n, dtype=torch.long)
        mask[n // 4:] = 1  # a prompt, then the supervised answer
        out.append(Sample(sid, torch.randint(0, 90, (n,), generator=g), mask))
    return out


CUDA = pytest.param(("flex", "cuda"), id="flex-cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])


@pytest.fixture(scope="module")
def wide_target_dir(tmp_path_factory):
    """The suite's small target with head_dim 16: compiled flex on CUDA needs >= 16."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=64,
                      num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=256, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("wide_target")
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.fixture(params=[("sdpa", "cpu"), ("flex", "cpu"), CUDA],
                ids=lambda p: "-".join(p) if isinstance(p, tuple) else None)
def setup(request, drafter_setup):
    attention, device = request.param
    drafter, target, head, spec, options = drafter_setup
    if device == "cuda":
        path = request.getfixturevalue("wide_target_dir")
        spec = build_drafter_spec(AutoConfig.from_pretrained(path).to_dict(), options)
        torch.manual_seed(1)
        drafter = DFlashDrafter(spec)
        target = load_target(path, spec.target_layer_ids, "cpu", torch.float32)
        head = load_target_head(path)
    objective = dataclasses.replace(Objective.from_config(spec, options), num_anchors=20,
                                    attention=attention)
    return drafter.to(device), target.to(device), head.to(device), objective


def _packed(setup, samples, row_mask=None):
    """Loss parts of one packed micro-batch; ``row_mask`` keeps the loss of those rows only."""
    drafter, target, head, objective = setup
    dev = head.embed.device
    batch = collate(samples, pad_id=0, pad_to=WIDTH, rows=PACK.tokens // WIDTH)
    with torch.no_grad():
        features = target(batch.input_ids.to(dev))
    anchors = objective.anchors(batch.loss_mask[:len(samples)], batch.sample_ids, seed=0,
                                epoch=1)
    loss_mask = batch.loss_mask
    if row_mask is not None:
        loss_mask = loss_mask * torch.cat([row_mask, torch.zeros(1, dtype=torch.long)])[:, None]
    pooled = pack_anchors(anchors, WIDTH, PACK.anchors)
    assert pooled.num_blocks == PACK.anchors and int(pooled.keep.sum()) == int(anchors.keep.sum())
    feats, ids, mask, positions = pack_rows(features, batch.input_ids.to(dev),
                                            loss_mask.to(dev), PACK.tokens)
    assert feats.shape[:2] == (1, PACK.tokens)
    return drafter_loss(drafter, head, objective, feats, ids, mask, pooled.to(dev), None,
                        positions)


def _single(setup, sample):
    drafter, target, head, objective = setup
    dev = head.embed.device
    batch = collate([sample], pad_id=0)
    ids, loss_mask = batch.input_ids.to(dev), batch.loss_mask.to(dev)
    with torch.no_grad():
        features = target(ids)
    anchors = objective.anchors(batch.loss_mask, batch.sample_ids, seed=0, epoch=1)
    return drafter_loss(drafter, head, objective, features, ids, loss_mask, anchors.to(dev))


def _grads(drafter, loss):
    drafter.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in drafter.parameters()]


def test_packed_batch_equals_its_samples_one_by_one(setup):
    drafter, objective = setup[0], setup[3]
    samples = _samples([17, 32, 23])
    # Flex attention has no backward on CPU: its gradients are checked on CUDA (the GPU
    # tier runs the flex-cuda case); on CPU its forward (the BlockMask with document starts).
    grad = objective.attention == "sdpa" or drafter.fc.weight.is_cuda
    with torch.set_grad_enabled(grad):
        packed = _packed(setup, samples)
        singles = [_single(setup, s) for s in samples]  # each alone, unpadded
    num = sum(p.numerator for p in singles)
    den = sum(float(p.denominator) for p in singles)
    assert float(packed.denominator) == pytest.approx(den, rel=1e-6) and den > 0
    assert float(packed.numerator.detach()) == pytest.approx(float(num.detach()), rel=1e-5)
    torch.testing.assert_close(packed.correct, sum(p.correct for p in singles))
    torch.testing.assert_close(packed.total, sum(p.total for p in singles))
    if not grad:
        return
    want = _grads(drafter, num / den)
    got = _grads(drafter, packed.numerator / packed.denominator)
    assert any(g.abs().sum() > 0 for g in got)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@torch.no_grad()
def test_perturbing_one_document_leaves_the_others_alone(setup):
    samples = _samples([17, 32, 23])
    changed = list(samples)
    ids = samples[1].input_ids.clone()
    ids[5:] = (ids[5:] + 1) % 90
    changed[1] = dataclasses.replace(samples[1], input_ids=ids)
    for row in range(3):
        keep = torch.zeros(3, dtype=torch.long)
        keep[row] = 1
        before = _packed(setup, samples, keep)
        after = _packed(setup, changed, keep)
        if row == 1:
            assert not torch.isclose(before.numerator, after.numerator)
        else:
            torch.testing.assert_close(after.numerator, before.numerator, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(after.denominator, before.denominator)
            torch.testing.assert_close(after.correct, before.correct)


def test_pooled_anchors_keep_each_documents_span():
    positions = torch.tensor([[1, 4, 0], [2, 3, 5]])
    keep = torch.tensor([[True, True, False], [True, True, True]])
    pooled = pack_anchors(Anchors(positions, keep), row_len=8, pool=6)
    assert pooled.positions.tolist() == [[1, 4, 10, 11, 13, 13]]  # padding: the last again
    assert pooled.starts.tolist() == [[0, 0, 8, 8, 8, 8]]
    assert pooled.ends.tolist() == [[8, 8, 16, 16, 16, 16]]
    assert pooled.keep.tolist() == [[True] * 5 + [False]]
    with pytest.raises(ValueError, match="data.anchors_per_micro_batch"):
        pack_anchors(Anchors(positions, keep), row_len=8, pool=4)
    with pytest.raises(ValueError, match="data.tokens_per_micro_batch"):
        pack_rows(torch.zeros(2, 8, 3), torch.zeros(2, 8), torch.zeros(2, 8), tokens=15)
