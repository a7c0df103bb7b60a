"""A disk that fills during a job: one headline naming the file and the kept checkpoint, rc 1,
nothing empty or half-written left behind, the previous checkpoint intact and found by latest().

The full disks are real: /dev/full for each writer, and a small tmpfs mounted in a private
user and mount namespace (``unshare``) for the CLI jobs and for writes that run out of room
midway. Those are skipped only where this machine cannot mount one, with its reason.
"""

import functools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import pytest
import torch

from pipeline.checkpoint import folders as ckpt
from pipeline.checkpoint.files import save_state
from pipeline.checkpoint.point import ResumePoint
from pipeline.job.config import JobConfig
from pipeline.runtime.diskfull import DiskFullError, temp_name
from pipeline.driver.telemetry import MetricsLogger
from pipeline.driver.trace import TraceRecorder

ROOT = Path(__file__).resolve().parents[2]
FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(
    not (FULL.exists() and stat.S_ISCHR(FULL.stat().st_mode)),
    reason="/dev/full (the kernel's always-full device) is missing on this machine")


def _save(out_dir, step):
    staging = ckpt.staging_dir(out_dir, step)
    record = save_state({"steps_done": step, "w": torch.full((4,), float(step))},
                        staging / "drafter.pt")
    return ckpt.finalize(staging, ResumePoint(step, 0, 2 * step), [record], {})


@needs_dev_full
def test_a_state_json_that_does_not_fit_leaves_the_previous_checkpoint(tmp_path):
    previous = _save(tmp_path, 2)
    staging = ckpt.staging_dir(tmp_path, 4)
    record = save_state({"steps_done": 4}, staging / "drafter.pt")
    (staging / "state.json").symlink_to(FULL)  # writes through it fail with ENOSPC
    with pytest.raises(DiskFullError) as info:
        ckpt.finalize(staging, ResumePoint(4, 0, 8), [record], {})
    assert info.value.filename == str(staging / "state.json")
    assert [p.name for p in ckpt.checkpoint_root(tmp_path).iterdir()] == ["step_00000002"]
    assert ckpt.latest(tmp_path) == previous and ckpt.problem(previous) is None


@needs_dev_full
def test_trace_and_metrics_on_a_full_disk_name_their_file(tmp_path):
    trace = TraceRecorder(0, 1)
    trace._span("drafter fwd+bwd", "drafter0", 0.0, 1.0, 0)
    temp_name(tmp_path / "trace.json").symlink_to(FULL)
    with pytest.raises(DiskFullError, match="trace.json"):
        trace.write(tmp_path / "trace.json")
    assert not os.path.lexists(tmp_path / "trace.json")  # no empty trace.json
    (tmp_path / "metrics.jsonl").symlink_to(FULL)
    metrics = MetricsLogger(JobConfig(), tmp_path, resumed=True)
    with pytest.raises(DiskFullError) as info:
        metrics.log({"train/loss": 1.0}, 1)
    assert info.value.filename == str(tmp_path / "metrics.jsonl")
    metrics.close()  # nothing left buffered to fail again


# -- a real filesystem that fills up --------------------------------------------------------

_MOUNT = 'mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"'


@functools.lru_cache(maxsize=1)
def _no_tmpfs() -> Optional[str]:
    """Why this machine cannot mount a private tmpfs (None: it can)."""
    if shutil.which("unshare") is None:
        return "no unshare binary (util-linux) to mount a private tmpfs"
    with tempfile.TemporaryDirectory() as mnt:
        probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                                _MOUNT, "sh", "64k", mnt, "true"],
                               capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return f"cannot mount a tmpfs in a user namespace here: {probe.stderr.strip()}"
    return None


def _on_tmpfs(size: str, mnt: Path, *cmd: str, env=None, timeout=120):
    """Run ``cmd`` with a fresh tmpfs of ``size`` on ``mnt`` (gone when it ends)."""
    reason = _no_tmpfs()
    if reason is not None:
        pytest.skip(reason)
    mnt.mkdir()
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           _MOUNT, "sh", size, str(mnt), *cmd], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


_WRITES = r"""
import json, os, sys
from pathlib import Path
from pipeline.job.config import JobConfig
from pipeline.runtime.diskfull import DiskFullError
from pipeline.driver.telemetry import MetricsLogger
from pipeline.driver.trace import TraceRecorder

mnt = Path(sys.argv[1])
metrics = MetricsLogger(JobConfig(), mnt)
metrics.log({"train/loss": 1.0}, 1)
fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
try:  # every free page: what is left is the room in metrics.jsonl's last page
    while os.write(fd, bytes(1 << 16)):
        pass
except OSError:
    pass
out = {}
try:
    metrics.log({"pad": "x" * 10_000}, 2)  # runs out of room midway
except DiskFullError as exc:
    out["metrics"] = exc.filename
metrics.log({"train/loss": 0.5}, 3)  # the room in the page is still there
metrics.close()
out["rows"] = (mnt / "metrics.jsonl").read_text()
trace = TraceRecorder(0, 1)
for i in range(200):
    trace._span("drafter fwd+bwd", "drafter0", float(i), 1.0, 0)
try:
    trace.write(mnt / "trace.json")
except DiskFullError as exc:
    out["trace"] = exc.filename
out["files"] = sorted(os.listdir(mnt))
print(json.dumps(out))
"""


@pytest.mark.slow
def test_writes_that_run_out_of_room_midway_leave_whole_files(tmp_path):
    mnt = tmp_path / "mnt"
    proc = _on_tmpfs("256k", mnt, sys.executable, "-c", _WRITES, str(mnt),
                     env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["metrics"] == str(mnt / "metrics.jsonl")
    rows = [json.loads(line) for line in out["rows"].splitlines()]
    assert [r["step"] for r in rows] == [1, 3] and out["rows"].endswith("\n")
    assert out["trace"] == str(mnt / "trace.json")
    assert out["files"] == ["filler", "metrics.jsonl"]  # no trace.json, no temporary file


# -- the CLI on a disk that fills -----------------------------------------------------------

_JOBS = r"""
import hashlib, json, os, shutil, subprocess, sys
from pathlib import Path

mnt, copies = Path(sys.argv[1]), Path(sys.argv[2])
run = mnt / "run"
base = [sys.executable, "-m", "pipeline.train", "cluster.targets_per_node=1",
        "cluster.drafters_per_node=1", "train.eval.every=-1", "train.checkpoint.every=2",
        f"train.out_dir={run}"]


def job(name, *cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=240)
    shutil.copytree(run, copies / name, symlinks=True)
    return {"rc": p.returncode, "out": p.stdout}


def leave_free(nbytes):
    st = os.statvfs(mnt)
    with open(mnt / "filler", "ab") as f:
        f.write(bytes(max(0, st.f_bavail * st.f_frsize - nbytes)))


out = {"first": job("first", *base, "train.plan.max_steps=2")}
step_2 = run / "checkpoints" / "step_00000002"
size = sum(p.stat().st_size for p in step_2.rglob("*") if p.is_file())
leave_free(size // 2)  # step 4's checkpoint does not fit; metrics rows and trace.json do
(run / "trace.json").mkdir()  # but trace.json cannot replace a folder: a clean-up fails too
out["checkpoint"] = job("checkpoint", *base, "train.plan.max_steps=4",
                        "train.checkpoint.resume=auto")
leave_free((run / "export" / "model.safetensors").stat().st_size // 2)  # nor does an export
out["export"] = job("export", sys.executable, "-m", "pipeline.export", "--checkpoint", str(run),
                    "--out", str(run / "export"))
print(json.dumps(out))
"""


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*")
            if p.is_file()}


def _last_line(output: str) -> str:
    """The headline: the last line the command wrote, with no traceback anywhere before it."""
    assert "Traceback" not in output and "inline_container" not in output, output[-4000:]
    return [line for line in output.splitlines() if line.strip()][-1]


def _intact(run: Path) -> None:
    """Nothing empty or cut off, no staging folder, and latest() finds step 2."""
    files = _files(run)
    assert not [name for name, size in files.items() if size == 0], files
    assert not [p for p in run.rglob(".*tmp-*")], files
    assert ckpt.latest(run) == run / "checkpoints" / "step_00000002"
    assert ckpt.read_point(ckpt.latest(run)).step == 2
    for line in (run / "metrics.jsonl").read_text().splitlines():
        json.loads(line)
    if (run / "trace.json").is_file():
        assert json.loads((run / "trace.json").read_text())["traceEvents"]


@pytest.mark.slow
def test_a_job_that_fills_the_disk_ends_with_one_line_and_keeps_its_checkpoint(
        tiny_assets, tmp_path):
    """On an 8 MB tmpfs: a CLI job writes step 2; the disk is filled so that a second job's
    step 4 checkpoint fails; then so that `python -m pipeline.export` fails."""
    mnt, copies = tmp_path / "mnt", tmp_path / "copies"
    env = dict(os.environ, DFLASH_ASSETS_DIR=tiny_assets.root, RAY_ADDRESS="",
               PYTHONPATH=str(ROOT))
    proc = _on_tmpfs("8m", mnt, sys.executable, "-c", _JOBS, str(mnt), str(copies), env=env,
                     timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["first"]["rc"] == 0, out["first"]["out"][-3000:]

    failed = out["checkpoint"]
    assert failed["rc"] == 1, failed["out"][-3000:]
    staging = f"{mnt}/run/checkpoints/.step_00000004.tmp-"
    assert re.search(rf"\]\[ERROR\] - no space left on device: could not write "
                     rf"{re.escape(staging)}\d+/(drafter/__0_\d+\.distcp|trainer\.pt); kept: the "
                     rf"previous checkpoint "
                     rf"{re.escape(str(mnt))}/run/checkpoints/step_00000002; free space, then "
                     rf"rerun with train.checkpoint.resume=auto to go on from it$",
                     _last_line(failed["out"])), failed["out"][-3000:]
    assert "[WARNING] - writing trace.json failed too" in failed["out"]  # not the headline
    _intact(copies / "checkpoint")
    assert sorted(os.listdir(copies / "checkpoint" / "checkpoints")) == ["step_00000002"]

    # The export CLI on the full disk: the earlier export stays as it was, nothing beside it.
    failed = out["export"]
    assert failed["rc"] == 1, failed["out"][-3000:]
    assert _last_line(failed["out"]) == (
        f"error: no space left on device: could not write {mnt}/run/export/model.safetensors; "
        f"{mnt}/run/export is as it was")
    _intact(copies / "export")
    first_export = _files(copies / "first" / "export")
    assert _files(copies / "export" / "export") == first_export
    for name in first_export:
        assert (copies / "export" / "export" / name).read_bytes() == \
            (copies / "first" / "export" / name).read_bytes()
