"""A checkpoint read ahead into pinned host memory loads onto the GPU exactly as the files do,
and its host tensors are the pinned save buffers afterwards (the CUDA side of
tests/checkpoint/test_read_ahead.py)."""

import torch
from torch import nn

from pipeline.checkpoint import sharded
from pipeline.checkpoint.host_copy import HostPool
from pipeline.checkpoint.read_ahead import ReadAhead
from pipeline.checkpoint.writer import AsyncSaver


def _model(device):
    return nn.Sequential(nn.Linear(64, 256), nn.LayerNorm(256), nn.Linear(256, 32)).to(device)


def test_pinned_read_ahead_loads_on_the_device_as_the_files_do(tmp_path, device, on_cuda):
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
    ahead = ReadAhead.start(tmp_path, pin=on_cuda)
    loaded = []
    for host in (None, ahead.take(tmp_path)):
        fresh = _model(device)
        fresh_optim = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
        sharded.load(fresh, fresh_optim, tmp_path, group=None, host=host)
        loaded.append((fresh, fresh_optim))
        if host is not None:
            assert host.pinned == on_cuda
            assert all(t.is_pinned() == on_cuda for t in host.tensors())
    (files, files_optim), (ahead_model, ahead_optim) = loaded
    for a, b, c in zip(ahead_model.parameters(), files.parameters(), model.parameters()):
        assert a.device.type == torch.device(device).type
        assert torch.equal(a, b) and torch.equal(a, c)
    for a, b in zip(ahead_optim.state.values(), files_optim.state.values()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(a[key], b[key]), key
