"""target.stages=2 on one GPU: two stage actors sharing the device (activations and tap
columns crossing between their processes over CUDA IPC) give the taps of the whole target."""

from __future__ import annotations

import pytest
import ray
import torch

from bench.scale.stages import start_reader
from pipeline.driver.staged import connect_stages, produce_chain, start_stages
from pipeline.model.target import load_target
from pipeline.runtime.ray_start import Placement, kill_actors
from pipeline.workers.messages import MicroBatch, MicroBatchMeta

TAPS = (0, 2, 4)  # 5 of the fixture target's 6 layers: stages [0, 2) and [2, 5)
ROWS, LENGTH, SLOTS = 3, 96, 3


def _batch(index: int) -> MicroBatch:
    g = torch.Generator().manual_seed(index)
    ids = torch.randint(0, 90, (ROWS, LENGTH - 7 * index), generator=g)
    meta = MicroBatchMeta(step=0, epoch=0, index=index, num_in_step=SLOTS,
                          sample_ids=tuple(range(index * ROWS, (index + 1) * ROWS)),
                          shape=tuple(ids.shape))
    return MicroBatch(meta, ids, torch.ones_like(ids))


@pytest.fixture()
def stages(ray_session, device, wide_target_dir):
    hidden = 64  # wide_target_dir: 4 heads x 16
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    chain = start_stages(
        lambda s: Placement(cpus=0.5, gpus=0.4 if device == "cuda" else 0.0), 2,
        rank=0, target_path=str(wide_target_dir), tap_ids=TAPS, device=device, dtype=dtype,
        num_slots=SLOTS, slot_numel=ROWS * LENGTH * len(TAPS) * hidden,
        act_numel=ROWS * LENGTH * hidden)
    yield chain, dtype
    ray.get([h.close.remote() for h in chain])
    kill_actors(chain)


def test_two_stages_sharing_a_gpu_give_the_whole_targets_taps(stages, device, wide_target_dir):
    chain, dtype = stages
    connect_stages([chain])
    batches = [_batch(i) for i in range(SLOTS)]
    # Every slot in flight through both stages before any is read.
    refs = [produce_chain(chain, slot, ray.put(b)) for slot, b in enumerate(batches)]
    readies = ray.get(refs)
    whole = load_target(wide_target_dir, TAPS, torch.device(device), dtype)
    # Read as a drafter reads: in another actor on the GPU, over CUDA IPC.
    reader = start_reader(device)
    try:
        ray.get(reader.attach.remote(chain[-1].ring_handle.remote()))
        for batch, ready in zip(batches, readies):
            assert ready.sample_ids == batch.meta.sample_ids and ready.meta.on_main_thread
            got = ray.get(reader.read.remote(ready))
            expected = whole(batch.input_ids.to(device)).cpu()
            assert got.shape == expected.shape
            assert expected.abs().amax() > 0.1
            tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}
            torch.testing.assert_close(got, expected, **tol)
    finally:
        ray.get(reader.close.remote())
        kill_actors([reader])
