"""Durable checkpoints: torn and corrupt files are skipped, staging is cleaned, keep_last prunes
after the new folder is in place, changed data is refused, and loading runs no code."""

import json
import logging
import os

import pytest
import torch

from pipeline.checkpoint import folders as ckpt
from pipeline.checkpoint.files import load_state, save_state
from pipeline.checkpoint.point import ResumePoint
from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver
from pipeline.export import export_checkpoint
from pipeline.model.config import DrafterConfig, build_drafter_spec
from pipeline.training.config import OptimConfig
from pipeline.training.plan import job_plan
from pipeline.workers.drafter_worker import DrafterWorker


def _save(out_dir, step, extra=None, payload=None):
    """A checkpoint as the driver writes one: drafter.pt staged, then finalized."""
    staging = ckpt.staging_dir(out_dir, step)
    record = save_state(payload or {"steps_done": step, "w": torch.full((4,), float(step))},
                        staging / "drafter.pt")
    return ckpt.finalize(staging, ResumePoint(step, 0, 2 * step), [record], extra or {})


def test_a_truncated_or_incomplete_latest_checkpoint_is_skipped(tmp_path, caplog):
    for step in (2, 4, 6, 8):
        _save(tmp_path, step)
    assert ckpt.latest(tmp_path).name == "step_00000008"
    # step 8: drafter.pt truncated; step 6: state.json cut short; step 4: drafter.pt gone.
    pt = ckpt.checkpoint_root(tmp_path) / "step_00000008" / "drafter.pt"
    pt.write_bytes(pt.read_bytes()[:100])
    state = ckpt.checkpoint_root(tmp_path) / "step_00000006" / "state.json"
    state.write_text(state.read_text()[:30])
    (ckpt.checkpoint_root(tmp_path) / "step_00000004" / "drafter.pt").unlink()
    with caplog.at_level(logging.WARNING):
        found = ckpt.resolve_resume("auto", tmp_path)
    assert found.name == "step_00000002"
    assert load_state(found / "drafter.pt")["steps_done"] == 2
    for reason in ("step_00000008: drafter.pt has 100 bytes", "step_00000006: state.json "
                   "unreadable", "step_00000004: drafter.pt is missing"):
        assert reason in caplog.text
    # A flipped byte of the same size is caught by the digest.
    pt2 = found / "drafter.pt"
    data = bytearray(pt2.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pt2.write_bytes(bytes(data))
    assert ckpt.problem(found) == "drafter.pt does not match its recorded sha256"
    assert ckpt.resolve_resume("auto", tmp_path) is None
    with pytest.raises(ValueError, match="train.checkpoint.resume=.*not a usable checkpoint"):
        ckpt.resolve_resume(str(found), tmp_path)


def test_a_write_killed_midway_leaves_the_previous_checkpoint_and_is_cleaned_up(tmp_path):
    _save(tmp_path, 2)
    # What a kill during the write of step 4 leaves: a staging folder with a torn file and no
    # state.json (the rename into step_4 is the last thing a save does).
    staging = ckpt.staging_dir(tmp_path, 4)
    torch.save({"w": torch.zeros(1000)}, staging / "drafter.pt")
    with open(staging / "drafter.pt", "r+b") as f:
        f.truncate(50)
    assert ckpt.latest(tmp_path).name == "step_00000002"
    assert ckpt.clean_stale(tmp_path) == [staging]
    assert [p.name for p in ckpt.checkpoint_root(tmp_path).iterdir()] == ["step_00000002"]


def test_rewriting_a_step_replaces_it_only_once_the_new_one_is_in_place(tmp_path, monkeypatch):
    old = _save(tmp_path, 2)
    renames = []
    real_rename = os.rename

    def rename(src, dst):
        # At every rename, some complete step_2 exists (the old, aside or in place, or the new).
        renames.append((os.path.basename(src), os.path.basename(dst)))
        real_rename(src, dst)
    monkeypatch.setattr(os, "rename", rename)
    new = _save(tmp_path, 2, payload={"steps_done": 2, "w": torch.ones(3)})
    assert new == old and load_state(new / "drafter.pt")["w"].tolist() == [1.0, 1.0, 1.0]
    assert renames[0][0] == "step_00000002" and renames[0][1].startswith(".step_00000002.old")
    assert renames[1][1] == "step_00000002"
    assert [p.name for p in ckpt.checkpoint_root(tmp_path).iterdir()] == ["step_00000002"]


def test_keep_last_prunes_the_oldest(tmp_path):
    for step in (1, 2, 3, 4, 5):
        staging = ckpt.staging_dir(tmp_path, step)
        record = save_state({"steps_done": step}, staging / "drafter.pt")
        ckpt.finalize(staging, ResumePoint(step, 0, step), [record], {}, keep_last=2)
        names = sorted(p.name for p in ckpt.checkpoint_root(tmp_path).iterdir())
        assert names[-1] == f"step_{step:08d}" and len(names) == min(step, 2)


def test_a_crafted_pickle_is_refused_and_runs_nothing(tmp_path, random_target_dir,
                                                      target_config, runs_code):
    marker = tmp_path / "pwned"
    folder = _save(tmp_path, 2)
    # A checkpoint of the right shape whose drafter.pt runs code when unpickled.
    torch.save({"model": runs_code(marker), "steps_done": 2}, folder / "drafter.pt")
    state = json.loads((folder / "state.json").read_text())
    state["files"] = []  # as a checkpoint from elsewhere would carry: no digest to fail first
    state["drafter_config"] = {}
    (folder / "state.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match="refused to load.*could run code"):
        load_state(folder / "drafter.pt")
    with pytest.raises(ValueError, match="refused to load"):
        export_checkpoint(folder, tmp_path / "export")
    with pytest.raises(ValueError, match="refused to load"):
        _drafter_worker(random_target_dir, target_config).load_checkpoint(str(folder))
    assert not marker.exists()


def _drafter_worker(target_dir, target_config):
    options = DrafterConfig(num_layers=1, block_size=4, num_taps=2, mask_token_id=95,
                            num_anchors=4)
    return DrafterWorker(rank=0, world_size=1, spec=build_drafter_spec(target_config, options),
                         options=options, optim=OptimConfig(), seed=0,
                         target_path=str(target_dir), device="cpu", autocast_dtype=None,
                         feature_dtype=torch.float32, feature_numel=16, total_steps=1)


def test_plan_with_max_steps_below_the_steps_done_is_empty():
    ids = list(range(20))
    assert len(job_plan(ids, 0, 1, 2, 2, max_steps=4)) == 4
    assert job_plan(ids, 0, 1, 2, 2, max_steps=4, samples_done=8, steps_done=4) == []
    assert job_plan(ids, 0, 1, 2, 2, max_steps=4, samples_done=12, steps_done=6) == []


def _job(small_train_file, out, *extra):
    return compose_job(["train.eval.every=-1", f"data.train_path={small_train_file}",
                        f"train.out_dir={out}", "train.checkpoint.resume=auto", *extra])


def _contract(small_train_file, tmp_path):
    """What the driver of this job records in state.json beside the resume point."""
    return Driver(_job(small_train_file, tmp_path / "fresh"))._state_extra()


def test_resume_refuses_changed_data_unless_told(small_train_file, tmp_path, caplog):
    out = tmp_path / "run"
    _save(out, 4, extra=_contract(small_train_file, tmp_path))
    assert Driver(_job(small_train_file, out)).resume.step == 4
    changed = tmp_path / "changed.jsonl"
    changed.write_text("".join(small_train_file.read_text().splitlines(True)[:-1]))  # one less
    with pytest.raises(ValueError, match="cannot resume .*data.content .*"
                       "train.checkpoint.allow_data_change=true"):
        Driver(_job(changed, out))
    with caplog.at_level(logging.WARNING):
        driver = Driver(_job(changed, out, "train.checkpoint.allow_data_change=true"))
    assert driver.resume.step == 4 and "going on" in caplog.text


def test_max_steps_below_the_steps_done_trains_nothing(small_train_file, tmp_path, caplog):
    out = tmp_path / "run"
    _save(out, 4, extra=_contract(small_train_file, tmp_path))
    with caplog.at_level(logging.WARNING):
        summary = Driver(_job(small_train_file, out, "train.plan.max_steps=3")).run()
    assert summary.steps == 0 and summary.first_step == 4 and not summary.losses
    assert "nothing to train" in caplog.text
    assert not (out / "metrics.jsonl").exists()


_WRITER = """
import sys, torch
from pipeline.checkpoint import folders as ckpt
from pipeline.checkpoint.files import save_state
from pipeline.checkpoint.point import ResumePoint
out = sys.argv[1]
for step in range(1, 10_000):
    staging = ckpt.staging_dir(out, step)
    record = save_state({"steps_done": step, "w": torch.randn(1 << 19)}, staging / "drafter.pt")
    ckpt.finalize(staging, ResumePoint(step, 0, step), [record], {}, keep_last=2)
"""


@pytest.mark.slow
def test_a_writer_killed_at_any_moment_leaves_usable_checkpoints(tmp_path):
    """SIGKILL a process that writes checkpoints back to back (2 MB each, keep_last=2)."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)])
    try:
        deadline = time.monotonic() + 120
        # any step from the fourth on (zero-padded names): with keep_last=2 a given one lives
        # only a few ms, which a poller on a loaded machine can miss
        while not any(p.name >= "step_00000004" for p in ckpt.step_folders(tmp_path)):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.137)  # somewhere inside a later write; any moment must be safe
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    steps = [p for p in ckpt.checkpoint_root(tmp_path).iterdir() if p.name.startswith("step_")]
    assert steps and all(ckpt.problem(p) is None for p in steps)
    newest = ckpt.latest(tmp_path)
    assert newest == max(steps) and ckpt.read_point(newest).step >= 4
    ckpt.clean_stale(tmp_path)
    assert sorted(ckpt.checkpoint_root(tmp_path).iterdir()) == sorted(steps)


def test_running_out_of_memory_on_load_is_not_called_a_corrupt_file(
        tmp_path, random_target_dir, target_config, monkeypatch):
    """A GPU (or host) OOM while loading names memory, never a bad file: the checkpoint is
    fine, and resume=auto must not be told to skip it."""
    worker = _drafter_worker(random_target_dir, target_config)
    folder = tmp_path / "ck"
    folder.mkdir()
    save_state(worker.trainer.state_dict(), folder / "drafter.pt")

    def oom(state):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(worker.trainer, "load_state_dict", oom)
    with pytest.raises(MemoryError, match="out of cpu memory while loading .*checked out"):
        worker.load_checkpoint(str(folder))

    def host_oom(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate")
    monkeypatch.setattr(torch, "load", host_oom)
    with pytest.raises(MemoryError, match="out of memory while loading"):
        load_state(folder / "drafter.pt")


def test_loads_land_on_the_host_whatever_the_device(tmp_path):
    """RNG states must stay CPU ByteTensors for torch.set_rng_state: the load maps to CPU."""
    save_state({"rng": {"cpu": torch.get_rng_state()}, "w": torch.ones(3)}, tmp_path / "s.pt")
    state = load_state(tmp_path / "s.pt")
    assert state["rng"]["cpu"].device.type == "cpu" and state["rng"]["cpu"].dtype == torch.uint8
    torch.set_rng_state(state["rng"]["cpu"])
