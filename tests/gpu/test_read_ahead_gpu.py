"""A checkpoint read ahead into host memory, pinned or pageable (the drafter worker's choice),
loads onto the GPU exactly as the files do, and its host tensors keep the pinning asked for,
which decides whether they may become save buffers (the CUDA side of
tests/checkpoint/test_read_ahead.py)."""

import pytest
import torch
from torch import nn

from pipeline.checkpoint import sharded
from pipeline.checkpoint.host_copy import HostPool
from pipeline.checkpoint.read_ahead import ReadAhead
from pipeline.checkpoint.writer import AsyncSaver
from pipeline.dist.rendezvous import destroy_group, pick_master
from tests.checkpoint.test_read_ahead import drafter_worker, saved_by_a_drafter


def _model(device):
    return nn.Sequential(nn.Linear(64, 256), nn.LayerNorm(256), nn.Linear(256, 32)).to(device)


@pytest.mark.parametrize("pin", [True, False], ids=["pinned", "pageable"])
def test_read_ahead_loads_on_the_device_as_the_files_do(tmp_path, device, on_cuda, pin):
    pin = pin and on_cuda
    torch.manual_seed(0)
    model = _model(device)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        model(torch.randn(8, 64, device=device)).square().mean().backward()
        optim.step()
    pool = HostPool([], pin=on_cuda)
    saver = AsyncSaver(pool, group=None, owner=True, threads=2)
    saver.start(lambda: sharded.drafter_state(model, optim), lambda: {"steps_done": 2},
                tmp_path, 2)
    (done,) = saver.wait()
    assert done.error is None
    ahead = ReadAhead.start(tmp_path, pin=pin)
    loaded = []
    for host in (None, ahead.take(tmp_path)):
        fresh = _model(device)
        fresh_optim = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
        sharded.load(fresh, fresh_optim, tmp_path, group=None, host=host)
        loaded.append((fresh, fresh_optim))
        if host is not None:
            assert host.pinned == pin
            assert all(t.is_pinned() == pin for t in host.tensors())
    (files, files_optim), (ahead_model, ahead_optim) = loaded
    for a, b, c in zip(ahead_model.parameters(), files.parameters(), model.parameters()):
        assert a.device.type == torch.device(device).type
        assert torch.equal(a, b) and torch.equal(a, c)
    for a, b in zip(ahead_optim.state.values(), files_optim.state.values()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(a[key], b[key]), key


def test_a_restarted_drafter_reads_ahead_pageable_and_pins_its_save_buffers_after_the_load(
        tmp_path, device, on_cuda, random_target_dir, target_config):
    """The worker reads ahead into pageable memory (pinning beside the build stalled it), so
    none of the read tensors may become a save buffer on CUDA: after the load the pool pins
    one buffer per state tensor itself."""
    first = saved_by_a_drafter(tmp_path, random_target_dir, target_config, device)
    second = drafter_worker(random_target_dir, target_config, checkpoint=str(tmp_path),
                            device=device)
    master = pick_master()
    second.init_group(master.addr, master.port)
    try:
        host = second.read_ahead.take(tmp_path)
        second.read_ahead.take = lambda folder: host  # the same read, seen by the load
        assert not host.pinned and not any(t.is_pinned() for t in host.tensors())
        assert second.load_checkpoint(str(tmp_path)) == first.trainer.steps_done
        for a, b in zip(second.trainer.model.parameters(), first.trainer.model.parameters()):
            assert torch.equal(a, b)
        pool = second.saver.pool
        pool._thread.join()  # the background fill
        pooled = [t for ts in pool._free.values() for t in ts]
        assert len(pooled) == len(second._checkpoint_specs())
        assert all(t.is_pinned() == on_cuda for t in pooled)
        second.save_checkpoint(str(tmp_path / "again"))  # the pool serves a save
        (done,) = second.wait_saves()
        assert done.error is None
    finally:
        destroy_group()
