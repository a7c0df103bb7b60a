"""Length buckets (data.batching=bucket): the plan, its shapes, exact accounting and resume."""

import random
from collections import Counter

import pytest
import torch

from pipeline.checkpoint.point import ResumePoint
from pipeline.data import DataConfig, Sample, collate
from pipeline.data.batching import BatchShapes, bucket_micro_batches
from pipeline.training.plan import job_plan

BUCKETS = (64, 128, 256, 512)


def _lengths(n: int, seed: int = 0) -> dict[int, int]:
    """Sample id -> length, spread over every bucket; ids are sparse like real line indices."""
    rng = random.Random(seed)
    return {3 * i + 1: rng.randint(40, 512) for i in range(n)}


def _shapes(**over) -> BatchShapes:
    data = DataConfig(max_length=512, batching="bucket", buckets=list(BUCKETS),
                      tokens_per_micro_batch=1024, **over)
    return BatchShapes.from_config(data, static_shapes=True, num_anchors=96)


def _plan(lengths, shapes, mbps, **kw):
    return job_plan(sorted(lengths), kw.pop("seed", 0), kw.pop("epochs", 3), 4, mbps,
                    shapes=shapes, lengths=lengths, **kw)


def _resume_point(plans, step: int, num_samples: int) -> ResumePoint:
    """What the driver's cursor records after ``step`` steps (pipeline/driver/cursor.py)."""
    done: Counter = Counter()
    for plan in plans[:step]:
        done[plan.epoch] += len(plan.sample_ids)
    epoch = plans[step - 1].epoch
    if done[epoch] >= num_samples:
        return ResumePoint(step, epoch + 1, 0)
    return ResumePoint(step, epoch, done[epoch])


def _steps(plans):
    return [(p.epoch, p.micro_batches) for p in plans]


def test_rows_follow_the_token_and_anchor_budgets():
    assert _shapes().rows == (16, 8, 4, 2)
    # 96 anchors per row at most: 64 -> 64 blocks a row, 128 and up -> 96.
    assert _shapes(anchors_per_micro_batch=384).rows == (6, 4, 4, 2)
    assert _shapes(anchors_per_micro_batch=10).rows == (1, 1, 1, 1)  # never below one row
    assert _shapes().max_tokens(512) == 1024
    pad = BatchShapes.from_config(DataConfig(max_length=512, micro_batch_size=3), True, 96)
    assert (pad.bucketed, pad.width([7, 9]), pad.max_tokens(512)) == (False, 512, 3 * 512)
    free = BatchShapes.from_config(DataConfig(max_length=512), False, 96)
    assert free.width([7, 9]) is None


def test_default_buckets_and_budget_come_from_max_length():
    data = DataConfig(max_length=3072, micro_batch_size=2, batching="bucket")
    assert data.resolved_buckets() == (512, 1024, 2048, 3072)
    assert data.resolved_tokens_per_micro_batch() == 6144
    assert DataConfig(max_length=800).resolved_buckets() == (128, 256, 512, 800)
    assert DataConfig(max_length=2).resolved_buckets() == (2,)


def test_each_micro_batch_holds_one_bucket_and_is_padded_to_it():
    lengths, shapes = _lengths(200), _shapes()
    mbs = bucket_micro_batches(sorted(lengths), lengths, shapes, seed=0, epoch=0)
    for mb in mbs:
        width = shapes.width([lengths[i] for i in mb])
        assert {shapes.bucket_of(lengths[i]) for i in mb} == {BUCKETS.index(width)}
        assert len(mb) <= shapes.rows[BUCKETS.index(width)]
    samples = [Sample(i, torch.ones(lengths[i], dtype=torch.long),
                      torch.ones(lengths[i], dtype=torch.long)) for i in mbs[0]]
    width = shapes.width([lengths[i] for i in mbs[0]])
    assert collate(samples, 0, width).input_ids.shape == (len(mbs[0]), width)
    # Lengths mix within steps: the interleaving is not bucket after bucket.
    widths = [shapes.width([lengths[i] for i in mb]) for mb in mbs]
    assert sum(a != b for a, b in zip(widths, widths[1:])) > len(BUCKETS)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_every_sample_exactly_once_per_epoch(seed):
    lengths = _lengths(157, seed)
    plans = _plan(lengths, _shapes(), mbps=3, seed=seed)
    for epoch in range(3):
        trained = Counter(i for p in plans if p.epoch == epoch for i in p.sample_ids)
        assert set(trained) == set(lengths) and set(trained.values()) == {1}
    epoch_orders = {tuple(i for p in plans if p.epoch == e for i in p.sample_ids)
                    for e in range(3)}
    assert len(epoch_orders) == 3  # each epoch its own order
    assert plans == _plan(lengths, _shapes(), mbps=3, seed=seed)  # deterministic
    assert plans != _plan(lengths, _shapes(), mbps=3, seed=seed + 1)


def test_shapes_are_at_most_two_per_bucket():
    lengths, shapes = _lengths(301), _shapes()
    seen = set()
    for seed in range(3):
        for plan in _plan(lengths, shapes, mbps=2, seed=seed):
            for mb in plan.micro_batches:
                seen.add((len(mb), shapes.width([lengths[i] for i in mb])))
    assert len(seen) <= 2 * len(BUCKETS)
    assert {w for _, w in seen} == set(BUCKETS)


@pytest.mark.parametrize("seed", [0, 3])
def test_resume_lands_on_the_same_micro_batch(seed):
    lengths = _lengths(97, seed)
    shapes = _shapes()
    full = _plan(lengths, shapes, mbps=3, seed=seed)
    for step in range(1, len(full)):
        point = _resume_point(full, step, len(lengths))
        resumed = _plan(lengths, shapes, mbps=3, seed=seed, start_epoch=point.epoch,
                        samples_done=point.samples_done, steps_done=point.step)
        # The same micro-batches in the same steps (StepPlan.index counts from the resume).
        assert _steps(resumed) == _steps(full[step:]), step


def test_resume_onto_another_layout_trains_the_rest_once():
    lengths, shapes = _lengths(97), _shapes()
    full = _plan(lengths, shapes, mbps=3, epochs=1)
    for step in (1, 2, len(full) // 2):
        point = _resume_point(full, step, len(lengths))
        rest = _plan(lengths, shapes, mbps=5, epochs=1, start_epoch=point.epoch,
                     samples_done=point.samples_done, steps_done=point.step)
        trained = Counter(i for p in full[:step] + rest for i in p.sample_ids)
        assert set(trained) == set(lengths) and set(trained.values()) == {1}


def test_a_cursor_inside_a_micro_batch_is_refused():
    lengths, shapes = _lengths(97), _shapes()
    first = _plan(lengths, shapes, mbps=1, epochs=1)[0]
    with pytest.raises(ValueError, match="data.buckets"):
        _plan(lengths, shapes, mbps=1, epochs=1, samples_done=len(first.sample_ids) - 1)


def test_pad_mode_plan_is_unchanged():
    ids = list(range(10))
    plans = job_plan(ids, 0, 1, 3, 2)
    assert [p.micro_batches for p in plans] == [((3, 2, 1), (8, 6, 0)), ((9, 5, 4), (7,))]


@pytest.mark.parametrize("over, key, allowed", [
    ({"batching": "packed"}, "batching", "['pad', 'bucket', 'pack']"),
    ({"buckets": [128, 64, 512]}, "buckets", "increasing integers >= 2 ending at"),
    ({"buckets": [64, 256]}, "buckets", "data.max_length (512)"),
    ({"buckets": []}, "buckets", "1 to 8"),
    ({"buckets": [2 + i for i in range(8)] + [512]}, "buckets", "1 to 8"),
    ({"buckets": [True, 512]}, "buckets", "integers >= 2"),
    ({"tokens_per_micro_batch": 500}, "tokens_per_micro_batch", ">= data.max_length (512)"),
    ({"anchors_per_micro_batch": 0}, "anchors_per_micro_batch", "integer >= 1"),
])
def test_bad_bucket_config_names_key_value_and_allowed(over, key, allowed):
    with pytest.raises(ValueError) as e:
        DataConfig(max_length=512, **over)
    assert f"data.{key}={over[key]!r}" in str(e.value) and allowed in str(e.value)


# -- data.batching=pack: the anchor pool fills micro-batches --------------------------------

def _packed(pool=200) -> BatchShapes:
    data = DataConfig(max_length=512, batching="pack", buckets=list(BUCKETS),
                      tokens_per_micro_batch=1024, anchors_per_micro_batch=pool)
    return BatchShapes.from_config(data, static_shapes=True, num_anchors=96)


def _anchor_counts(lengths, seed=0):
    rng = random.Random(seed + 100)
    return {i: min(96, rng.randint(1, n)) for i, n in lengths.items()}


@pytest.mark.parametrize("seed", [0, 5])
def test_packed_micro_batches_fill_the_pool_and_train_every_sample_once(seed):
    lengths, shapes = _lengths(157, seed), _packed()
    anchors = _anchor_counts(lengths, seed)
    assert (shapes.rows, shapes.pool) == ((16, 8, 4, 2), 200)
    plans = _plan(lengths, shapes, mbps=3, seed=seed, anchors=anchors)
    for epoch in range(3):
        trained = Counter(i for p in plans if p.epoch == epoch for i in p.sample_ids)
        assert set(trained) == set(lengths) and set(trained.values()) == {1}
    mbs = [mb for p in plans for mb in p.micro_batches]
    for mb in mbs:
        bucket = {shapes.bucket_of(lengths[i]) for i in mb}
        assert len(bucket) == 1 and len(mb) <= shapes.rows[bucket.pop()]
        assert sum(anchors[i] for i in mb) <= shapes.pool
    # Greedy in order: a micro-batch was closed only because the next sample did not fit.
    short = [mb for mb in mbs if shapes.bucket_of(lengths[mb[0]]) == 0]
    assert max(len(mb) for mb in short) > shapes.pool // 96  # more rows than 96-anchor rows
    assert plans == _plan(lengths, shapes, mbps=3, seed=seed, anchors=anchors)


@pytest.mark.parametrize("seed", [0, 3])
def test_packed_resume_lands_on_the_same_micro_batch(seed):
    lengths, shapes = _lengths(97, seed), _packed()
    anchors = _anchor_counts(lengths, seed)
    full = _plan(lengths, shapes, mbps=3, seed=seed, anchors=anchors)
    for step in range(1, len(full)):
        point = _resume_point(full, step, len(lengths))
        resumed = _plan(lengths, shapes, mbps=3, seed=seed, start_epoch=point.epoch,
                        samples_done=point.samples_done, steps_done=point.step,
                        anchors=anchors)
        assert _steps(resumed) == _steps(full[step:]), step


def test_packed_collate_pads_to_the_buckets_rows_and_counts_real_anchors():
    shapes = _packed()
    mask = torch.tensor([0, 0, 1, 1, 1, 0, 1, 1])  # anchors at 2, 3 and 6: three
    samples = [Sample(5, torch.arange(8), mask), Sample(9, torch.arange(70), torch.ones(70))]
    assert shapes.anchor_counts(samples) == {5: 3, 9: 69}
    batch = shapes.collate(samples, pad_id=0)
    assert batch.input_ids.shape == (8, 128) and batch.sample_ids == [5, 9]
    assert batch.lengths.tolist() == [8, 70] + [0] * 6 and batch.num_supervised == 5 + 70
    with pytest.raises(ValueError, match="drafter.num_anchors"):
        _packed(pool=95)
