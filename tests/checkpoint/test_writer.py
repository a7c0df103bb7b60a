"""Checkpoint saves in the background: the snapshot is the state at the call, the files are
recorded (read back) before the save is reported, a failed save is reported (not raised),
host buffers are reused, and the DCP index is read without running code."""

import errno
import logging
import pickle
import stat
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeline.checkpoint import sharded
from pipeline.checkpoint.files import load_state, sha256_file
from pipeline.checkpoint.host_copy import HostPool, map_tensors, snapshot
from pipeline.checkpoint.writer import TRAINER_FILE, AsyncSaver


def _trained():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 8)).sum().backward()
    optim.step()
    return model, optim


def _rest():
    return {"steps_done": 1, "scheduler": {"last_epoch": 1, "_last_lr": [1e-3]},
            "rng": {"cpu": torch.get_rng_state()}}


def _saver(pool_specs=(), threads=1):
    return AsyncSaver(HostPool(list(pool_specs), pin=False), group=None, owner=True,
                      threads=threads)


@pytest.mark.parametrize("threads", [1, 3])
def test_the_files_hold_the_state_at_the_call_not_after(tmp_path, threads):
    model, optim = _trained()
    want = map_tensors(sharded.drafter_state(model, optim), lambda t: t.clone())
    saver = _saver([((16, 8), torch.float32)], threads)
    held = saver.start(lambda: sharded.drafter_state(model, optim), _rest, tmp_path, 1)
    # Training goes on at once: in-place updates must not reach the files.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    for s in optim.state.values():
        s["exp_avg"].mul_(0.0)
    (done,) = saver.wait()
    assert done.error is None and done.steps_done == 1 and held >= 0
    names = [r.name for r in done.records]
    assert names[0] == TRAINER_FILE and "drafter/.metadata" in names
    # One file per writer thread (12 tensors, so none is empty), each recorded.
    assert sorted(n for n in names if n.startswith("drafter/__0_")) == \
        [f"drafter/__0_{i}.distcp" for i in range(threads)]
    for r in done.records:
        assert r.sha256 == sha256_file(tmp_path / r.name)
        assert r.size == (tmp_path / r.name).stat().st_size
    assert load_state(tmp_path / TRAINER_FILE)["steps_done"] == 1
    fresh = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    fresh_optim = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    sharded.load(fresh, fresh_optim, tmp_path, group=None)
    got = sharded.drafter_state(fresh, fresh_optim)
    for name, t in want["model"].items():
        assert torch.equal(got["model"][name], t), name
    for name, s in want["optimizer"]["state"].items():
        for key, t in s.items():
            assert torch.equal(got["optimizer"]["state"][name][key], t), (name, key)
    assert saver.done() == ()  # handed back once


def test_loading_keeps_gradient_buffers_and_the_learning_rate(tmp_path):
    model, optim = _trained()
    saver = _saver()
    saver.start(lambda: sharded.drafter_state(model, optim), _rest, tmp_path, 1)
    saver.wait()
    fresh = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    buffers = [torch.zeros_like(p) for p in fresh.parameters()]
    for p, g in zip(fresh.parameters(), buffers):
        p.grad = g
    fresh_optim = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    sharded.load(fresh, fresh_optim, tmp_path, group=None)
    assert all(p.grad is g for p, g in zip(fresh.parameters(), buffers))
    assert fresh_optim.param_groups[0]["lr"] == 1e-2


def test_a_failed_write_is_reported_and_the_next_one_works(tmp_path):
    model, optim = _trained()
    (tmp_path / "a-file").write_text("not a folder")
    saver = _saver()
    saver.start(lambda: sharded.drafter_state(model, optim), _rest, tmp_path / "a-file", 1)
    (failed,) = saver.wait()
    assert failed.records == () and failed.error is not None
    saver.start(lambda: sharded.drafter_state(model, optim), _rest, tmp_path / "ok", 2)
    (done,) = saver.wait()
    assert done.error is None and done.steps_done == 2


def test_host_buffers_are_reused_across_saves():
    state = {"w": torch.randn(64, 8), "m": torch.randn(64, 8)}
    pool = HostPool([((64, 8), torch.float32), ((64, 8), torch.float32)], pin=False)
    first, taken = snapshot(state, pool)
    pool.release(taken)
    second, _ = snapshot(state, pool)
    assert {first["w"].data_ptr(), first["m"].data_ptr()} == \
        {second["w"].data_ptr(), second["m"].data_ptr()}
    assert torch.equal(second["w"], state["w"])


def test_a_full_disk_is_reported_with_its_errno_and_no_traceback(tmp_path, caplog):
    full = Path("/dev/full")
    if not (full.exists() and stat.S_ISCHR(full.stat().st_mode)):
        pytest.skip("/dev/full (the kernel's always-full device) is missing on this machine")
    model, optim = _trained()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / TRAINER_FILE).symlink_to(full)  # writes through it fail: ENOSPC
    saver = _saver()
    with caplog.at_level(logging.WARNING):
        saver.start(lambda: sharded.drafter_state(model, optim), _rest, tmp_path / "full", 1)
        (failed,) = saver.wait()
    assert failed.records == () and failed.errno == errno.ENOSPC
    assert failed.error.startswith("DiskFullError") and "No space left" in failed.error
    assert "Traceback" not in caplog.text  # the driver says it, in one line
    saver.start(lambda: sharded.drafter_state(model, optim), _rest, tmp_path / "ok", 2)
    (done,) = saver.wait()
    assert done.error is None and done.errno is None


def test_a_full_disk_under_a_dcp_file_names_it_with_its_errno(tmp_path):
    """torch.save, which DCP writes tensors with, hides the OSError: the writer keeps it."""
    full = Path("/dev/full")
    if not (full.exists() and stat.S_ISCHR(full.stat().st_mode)):
        pytest.skip("/dev/full (the kernel's always-full device) is missing on this machine")
    model, optim = _trained()
    (tmp_path / "full" / "drafter").mkdir(parents=True)
    (tmp_path / "full" / "drafter" / "__0_0.distcp").symlink_to(full)
    saver = _saver()
    saver.start(lambda: sharded.drafter_state(model, optim), _rest, tmp_path / "full", 1)
    (failed,) = saver.wait()
    assert failed.records == () and failed.errno == errno.ENOSPC
    assert failed.file == str(tmp_path / "full" / "drafter" / "__0_0.distcp")
    assert "inline_container" not in failed.error


def _thread_deaths(monkeypatch):
    """Threads that end in an exception, as threading reports them (a traceback on stderr)."""
    died = []
    monkeypatch.setattr(threading, "excepthook", died.append)
    return died


def test_a_full_disk_under_another_writer_threads_file_is_reported_not_lost(tmp_path,
                                                                             monkeypatch):
    """DCP's extra writer threads die on an error and drop their files' results: the save
    must fail with the file's errno all the same, and no thread ends in a traceback."""
    died = _thread_deaths(monkeypatch)
    full = Path("/dev/full")
    if not (full.exists() and stat.S_ISCHR(full.stat().st_mode)):
        pytest.skip("/dev/full (the kernel's always-full device) is missing on this machine")
    model, optim = _trained()
    files = [tmp_path / "full" / "drafter" / f"__0_{i}.distcp" for i in range(3)]
    files[0].parent.mkdir(parents=True)
    for f in files:  # each thread meets one, whichever files it takes
        f.symlink_to(full)
    saver = _saver(threads=3)
    saver.start(lambda: sharded.drafter_state(model, optim), _rest, tmp_path / "full", 1)
    (failed,) = saver.wait()
    assert failed.records == () and failed.errno == errno.ENOSPC
    assert failed.file in {str(f) for f in files}
    assert died == []


def test_a_writer_thread_that_dies_outside_its_file_fails_the_save(tmp_path, monkeypatch):
    """An error before a thread opens its file ends that thread (DCP does not collect it):
    the items it held are missing from the results, and the save says so."""
    from torch.distributed.checkpoint import filesystem

    real = filesystem._SerialCpuLoader.add

    def add(self, *args):
        if threading.current_thread().name != "checkpoint-writer":  # one of DCP's threads
            raise RuntimeError("lost in a writer thread")
        return real(self, *args)

    monkeypatch.setattr(filesystem._SerialCpuLoader, "add", add)
    died = _thread_deaths(monkeypatch)
    model, optim = _trained()
    saver = _saver(threads=2)
    saver.start(lambda: sharded.drafter_state(model, optim), _rest, tmp_path / "lost", 1)
    (failed,) = saver.wait()
    assert failed.records == () and "checkpoint items were not written" in failed.error
    assert [str(d.exc_value) for d in died] == ["lost in a writer thread"]


def test_a_crafted_dcp_index_is_refused_and_runs_nothing(tmp_path, runs_code):
    model, optim = _trained()
    saver = _saver()
    saver.start(lambda: sharded.drafter_state(model, optim), _rest, tmp_path, 1)
    saver.wait()
    marker = tmp_path / "ran"
    with open(tmp_path / "drafter" / ".metadata", "wb") as f:
        pickle.dump(runs_code(marker), f)
    with pytest.raises(Exception, match="not part of a DCP index"):
        sharded.load(model, optim, tmp_path, group=None)
    assert not marker.exists()
