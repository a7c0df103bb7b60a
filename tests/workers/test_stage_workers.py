"""Staged targets as plain classes, without Ray: 2 and 3 stages give the taps of 1 stage."""

import pytest
import torch

from pipeline.model.stages import StagePlan, split_layers, stage_weight_bytes
from pipeline.transport.ring import RingReader
from pipeline.workers.messages import MicroBatch, MicroBatchMeta
from pipeline.workers.stage_worker import TargetStageWorker
from pipeline.workers.target_worker import TargetWorker

TAPS = (0, 2, 4)  # deepest tap 4: the cut target has 5 of the fixture's 6 layers
HIDDEN = 32
ROWS, LENGTH = 2, 19
TAP_NUMEL = ROWS * LENGTH * len(TAPS) * HIDDEN
ACT_NUMEL = ROWS * LENGTH * HIDDEN
SLOTS = 2


def _batch(index: int) -> MicroBatch:
    g = torch.Generator().manual_seed(index)
    ids = torch.randint(0, 90, (ROWS, LENGTH), generator=g)
    meta = MicroBatchMeta(step=0, epoch=0, index=index, num_in_step=4,
                          sample_ids=(2 * index, 2 * index + 1), shape=(ROWS, LENGTH))
    return MicroBatch(meta, ids, torch.ones_like(ids))


def _stages(path, k: int) -> list[TargetStageWorker]:
    stages = [TargetStageWorker(rank=0, stage=s, num_stages=k, target_path=str(path),
                                tap_ids=TAPS, device="cpu", dtype=torch.float32,
                                num_slots=SLOTS, slot_numel=TAP_NUMEL, act_numel=ACT_NUMEL)
              for s in range(k)]
    taps = stages[-1].ring_handle()
    writers = None
    for _ in range(2):  # connecting again (rendezvous after a drafter restart) opens nothing
        for s, stage in enumerate(stages):
            stage.connect(stages[s - 1].act_handle() if s else None, taps)
        assert writers is None or writers == [id(s.taps) for s in stages]
        writers = [id(s.taps) for s in stages]
    return stages


def _read(reader: RingReader, ready) -> torch.Tensor:
    out = torch.empty(TAP_NUMEL)
    reader.copy_out(ready, out)
    return out[:ready.shape[0] * ready.shape[1] * ready.shape[2]].view(ready.shape).clone()


def test_split_layers_is_contiguous_and_even():
    assert split_layers(5, 1) == [(0, 5)]
    assert split_layers(5, 2) == [(0, 2), (2, 5)]
    assert split_layers(36, 3) == [(0, 12), (12, 24), (24, 36)]
    plan = StagePlan.of(TAPS, 1, 3)
    assert (plan.start, plan.end) == (1, 3) and plan.columns() == [(1, 2)]


def test_more_stages_than_layers_is_refused():
    with pytest.raises(ValueError, match=r"target.stages=6 .* 5 decoder layers.* 1..5"):
        split_layers(5, 6)


@pytest.mark.parametrize("k", [2, 3])
def test_stages_give_the_taps_of_one_stage(random_target_dir, k):
    whole = TargetWorker(rank=0, target_path=str(random_target_dir), tap_ids=TAPS,
                         device="cpu", dtype=torch.float32, num_slots=SLOTS,
                         slot_numel=TAP_NUMEL)
    stages = _stages(random_target_dir, k)
    reader = RingReader("cpu")
    try:
        # Each stage holds only its slice of layers (and stage 0 the embedding).
        held = [len(s.stage.model.get_decoder().layers) for s in stages]
        assert held == [b - a for a, b in split_layers(5, k)]
        assert stages[0].stage.model.get_decoder().embed_tokens is not None
        assert all(s.stage.model.get_decoder().embed_tokens is None for s in stages[1:])
        reader.attach(stages[-1].ring_handle())
        ref_reader = RingReader("cpu")
        ref_reader.attach(whole.ring_handle())
        # Two micro-batches in flight through the chain before either is read.
        readies = []
        for i, slot in enumerate([1, 0]):
            out = None
            for stage in stages:
                out = stage.produce(slot, _batch(i), out)
            readies.append(out)
        for i, ready in enumerate(readies):
            assert ready.shape == (ROWS, LENGTH, len(TAPS) * HIDDEN)
            assert ready.sample_ids == (2 * i, 2 * i + 1) and ready.meta.index == i
            expected = _read(ref_reader, whole.produce(ready.slot, _batch(i)))
            got = _read(reader, ready)
            # Same kernels on the same layers: close, not promised bit-exact.
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            assert got.abs().amin(dim=(0, 1)).sum() > 0  # every column written
        ref_reader.close()
    finally:
        reader.close()
        for stage in stages:
            stage.close()
        whole.close()


def test_stage_weight_bytes_split_the_cut_target(random_target_dir):
    one = stage_weight_bytes(random_target_dir, TAPS, 1)
    two = stage_weight_bytes(random_target_dir, TAPS, 2)
    assert sum(two) == one[0]
    # Stage 0 holds the embedding (96 x 32) and 2 layers; stage 1 the other 3 layers.
    layer = (one[0] - 96 * 32 * 2) // 5
    assert two == [96 * 32 * 2 + 2 * layer, 3 * layer]
