"""Checkpoint writes in the background: the snapshot is the state at the call, the write is
verified before it is reported, a failed write is reported (not raised), buffers are reused."""

import errno
import logging
import stat
from pathlib import Path

import pytest
import torch

from pipeline.checkpoint.writer import AsyncSaver, HostPool, map_tensors, snapshot
from pipeline.checkpoint.files import load_state, sha256_file


def _state():
    torch.manual_seed(0)
    return {"model": {"w": torch.randn(64, 8), "b": torch.randn(8)},
            "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(64, 8)}},
                          "param_groups": [{"lr": 1e-3, "params": [0]}]},
            "steps_done": 3, "rng": {"cpu": torch.get_rng_state()}}


def test_the_file_holds_the_state_at_the_call_not_after(tmp_path):
    state = _state()
    want = map_tensors(state, lambda t: t.clone())
    saver = AsyncSaver(HostPool([((64, 8), torch.float32)], pin=False))
    held = saver.start(lambda: state, tmp_path / "drafter.pt", steps_done=3)
    # Training goes on at once: in-place updates and a changed LR must not reach the file.
    state["model"]["w"].add_(1.0)
    state["optimizer"]["state"][0]["exp_avg"].mul_(0.0)
    state["optimizer"]["param_groups"][0]["lr"] = 5.0
    (done,) = saver.wait()
    assert done.error is None and done.steps_done == 3 and held >= 0
    assert done.record.sha256 == sha256_file(tmp_path / "drafter.pt")
    assert done.record.size == (tmp_path / "drafter.pt").stat().st_size
    loaded = load_state(tmp_path / "drafter.pt")
    assert torch.equal(loaded["model"]["w"], want["model"]["w"])
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"],
                       want["optimizer"]["state"][0]["exp_avg"])
    assert loaded["optimizer"]["param_groups"][0]["lr"] == 1e-3
    assert torch.equal(loaded["rng"]["cpu"], want["rng"]["cpu"])
    assert saver.done() == ()  # handed back once


def test_a_failed_write_is_reported_and_the_next_one_works(tmp_path):
    saver = AsyncSaver(HostPool([], pin=False))
    saver.start(_state, tmp_path / "missing-folder" / "drafter.pt", steps_done=1)
    (failed,) = saver.wait()
    assert failed.record is None and "No such file" in failed.error
    saver.start(_state, tmp_path / "drafter.pt", steps_done=2)
    (done,) = saver.wait()
    assert done.error is None and done.steps_done == 2


def test_host_buffers_are_reused_across_saves(tmp_path):
    pool = HostPool([((64, 8), torch.float32), ((64, 8), torch.float32)], pin=False)
    first, taken = snapshot(_state(), pool)
    pool.release(taken)
    second, _ = snapshot(_state(), pool)
    ids = lambda s: {s["model"]["w"].data_ptr(), s["optimizer"]["state"][0]["exp_avg"].data_ptr()}  # noqa: E731
    assert ids(first) == ids(second)
    assert torch.equal(second["model"]["w"], _state()["model"]["w"])


def test_a_full_disk_is_reported_with_its_errno_and_no_traceback(tmp_path, caplog):
    full = Path("/dev/full")
    if not (full.exists() and stat.S_ISCHR(full.stat().st_mode)):
        pytest.skip("/dev/full (the kernel's always-full device) is missing on this machine")
    (tmp_path / "drafter.pt").symlink_to(full)  # writes through it fail with ENOSPC
    saver = AsyncSaver(HostPool([], pin=False))
    with caplog.at_level(logging.WARNING):
        saver.start(_state, tmp_path / "drafter.pt", steps_done=1)
        (failed,) = saver.wait()
    assert failed.record is None and failed.errno == errno.ENOSPC
    assert failed.error.startswith("DiskFullError") and "No space left" in failed.error
    assert "Traceback" not in caplog.text  # the driver says it, in one line
    saver.start(_state, tmp_path / "ok.pt", steps_done=2)
    (done,) = saver.wait()
    assert done.error is None and done.errno is None
