"""A bucketed or packed micro-batch trains exactly what its samples do one by one.

Bucketed (data.batching=bucket): each sample a row, padded to the bucket's length. Packed
(data.batching=pack): the rows, plus an empty one, as one drafter sequence with one anchor
pool (pipeline/objective/packing.py).

On CPU the check is in fp32 (sdpa, and flex's forward). On CUDA it runs as production does:
compiled flex attention at head_dim 128 and block size 16, a bf16 target and head, fp32
master weights under bf16 autocast. Compiled flex in torch 2.11 finds no kernel for fewer than
128 queries (NoValidChoicesError, seen on the H200 for 20 anchors x block 4 in fp32 and in
bf16), which block 16 keeps clear of, as production shapes do.
"""

import contextlib
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
from pipeline.objective.step import FLEX_MIN_QUERIES, Objective, drafter_loss

WIDTH = 32  # the bucket's length: every sample is padded to it
PACK = Packing(tokens=4 * WIDTH, anchors=56)  # 4 rows, 3 samples: one empty row, pool tail
LAYOUTS = ("bucket", "pack")
CUDA = pytest.param(("flex", "cuda"), id="flex-cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])


def _samples(lengths, seed=5):
    g = torch.Generator().manual_seed(seed)
    out = []
    for sid, n in zip((11, 42, 7), lengths):
        mask = torch.zeros(n, dtype=torch.long)
        mask[n // 4:] = 1  # a prompt, then the supervised answer
        out.append(Sample(sid, torch.randint(0, 90, (n,), generator=g), mask))
    return out


@pytest.fixture(params=[("sdpa", "cpu"), ("flex", "cpu"), CUDA],
                ids=lambda p: "-".join(p) if isinstance(p, tuple) else None)
def setup(request, drafter_setup):
    attention, device = request.param
    drafter, target, head, spec, options = drafter_setup
    dtype = None  # fp32 throughout
    if device == "cuda":
        dtype = torch.bfloat16
        path = request.getfixturevalue("production_heads_target_dir")
        options = dataclasses.replace(options, block_size=16)  # >= 128 queries (see top)
        spec = build_drafter_spec(AutoConfig.from_pretrained(path).to_dict(), options)
        torch.manual_seed(1)
        drafter = DFlashDrafter(spec)
        target = load_target(path, spec.target_layer_ids, "cpu", dtype)
        head = load_target_head(path).to(device, dtype)
    # 20 anchors: a 17-token sample alone pads them to 17, the 32-token bucket to 20.
    objective = dataclasses.replace(Objective.from_config(spec, options), static_shapes=True,
                                    num_anchors=20, attention=attention)
    return drafter.to(device), target.to(device), head.to(device), objective, dtype


def _tolerance(setup) -> dict:
    """How close a batch and its samples agree: fp32 to rounding; bf16 (CUDA) to what its
    8-bit mantissa leaves after summing differently ordered blocks."""
    bf16 = setup[4] is not None
    return {"loss": 1e-2 if bf16 else 1e-5, "grad": 3e-2 if bf16 else 1e-4,
            "alone": 1e-3 if bf16 else 1e-6}


def _parts(setup, layout, samples, row_mask=None):
    """Loss parts of one micro-batch (None layout: unpadded); ``row_mask`` keeps the loss of
    those rows only (the anchors are drawn before, from every row)."""
    drafter, target, head, objective, dtype = setup
    dev = head.embed.device
    rows = PACK.tokens // WIDTH if layout == "pack" else None
    batch = collate(samples, pad_id=0, pad_to=WIDTH if layout else None, rows=rows)
    with torch.no_grad():
        features = target(batch.input_ids.to(dev))
    anchors = objective.anchors(batch.loss_mask[:len(samples)], batch.sample_ids, seed=0,
                                epoch=1)
    loss_mask = batch.loss_mask
    if row_mask is not None:
        extra = loss_mask.shape[0] - len(row_mask)
        loss_mask = loss_mask * torch.cat([row_mask, torch.zeros(extra, dtype=torch.long)])[:, None]
    ids, loss_mask, positions = batch.input_ids.to(dev), loss_mask.to(dev), None
    if layout == "bucket":
        floor = -(-FLEX_MIN_QUERIES // objective.block_size) if objective.attention == "flex" else 1
        assert anchors.num_blocks == max(min(objective.num_anchors, WIDTH), floor)
    if layout == "pack":
        pooled = pack_anchors(anchors, WIDTH, PACK.anchors)
        assert pooled.num_blocks == PACK.anchors
        assert int(pooled.keep.sum()) == int(anchors.keep.sum())
        anchors = pooled
        features, ids, loss_mask, positions = pack_rows(features, ids, loss_mask, PACK.tokens)
        assert features.shape[:2] == (1, PACK.tokens)
    autocast = torch.autocast("cuda", dtype) if dtype else contextlib.nullcontext()
    with autocast:
        return drafter_loss(drafter, head, objective, features, ids, loss_mask,
                            anchors.to(dev), dtype, positions)


def _grads(drafter, loss):
    drafter.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in drafter.parameters()]


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_batch_equals_its_samples_one_by_one(setup, layout):
    drafter, objective = setup[0], setup[3]
    samples = _samples([17, 32, 23])
    # Flex attention has no backward on CPU: its gradients are checked on CUDA (the GPU
    # tier runs the flex-cuda case); on CPU its forward (the BlockMask, document starts).
    grad = objective.attention == "sdpa" or drafter.fc.weight.is_cuda
    with torch.set_grad_enabled(grad):
        batch = _parts(setup, layout, samples)
        singles = [_parts(setup, None, [s]) for s in samples]  # each alone, at its length
    num = sum(p.numerator for p in singles)
    den = sum(float(p.denominator) for p in singles)
    tol = _tolerance(setup)
    assert float(batch.denominator) == pytest.approx(den, rel=1e-6) and den > 0
    assert float(batch.numerator.detach()) == pytest.approx(float(num.detach()), rel=tol["loss"])
    torch.testing.assert_close(batch.correct, sum(p.correct for p in singles))
    torch.testing.assert_close(batch.total, sum(p.total for p in singles))
    if not grad:
        return
    # The update: sum(gradients of numerators) / sum(denominators), as the step divides.
    want = _grads(drafter, num / den)
    got = _grads(drafter, batch.numerator / batch.denominator)
    assert any(g.abs().sum() > 0 for g in got)
    if setup[4] is None:
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
        return
    # bf16: elementwise closeness means little for near-zero entries; each tensor's
    # gradient as a whole must agree (relative norm of the difference).
    errors = [float((a - b).norm() / b.norm()) for a, b in zip(got, want) if b.norm() > 0]
    assert max(errors) < tol["grad"], errors


@pytest.mark.parametrize("layout", LAYOUTS)
@torch.no_grad()
def test_perturbing_one_sample_leaves_the_others_alone(setup, layout):
    samples = _samples([17, 32, 23])
    changed = list(samples)
    ids = samples[1].input_ids.clone()
    ids[5:] = (ids[5:] + 1) % 90
    changed[1] = dataclasses.replace(samples[1], input_ids=ids)
    for row in range(3):
        keep = torch.zeros(3, dtype=torch.long)
        keep[row] = 1
        before = _parts(setup, layout, samples, keep)
        after = _parts(setup, layout, changed, keep)
        if row == 1:
            assert not torch.isclose(before.numerator, after.numerator)
        else:
            torch.testing.assert_close(after.numerator, before.numerator,
                                       rtol=_tolerance(setup)["alone"], atol=1e-7)
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
