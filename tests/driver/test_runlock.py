"""The run-folder lock: held for a job, refused while its holder lives, taken over when the
holder is gone, exactly one winner when jobs start together."""

import contextlib
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.driver import runlock
from pipeline.driver.runlock import (LOCK_NAME, RunLock, RunLocked, is_running, process_start,
                                     this_process)

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def _left_by_a_dead_job(out: Path) -> int:
    """A real lock whose holder exited without releasing it (as a killed job leaves it)."""
    subprocess.run([sys.executable, "-c", "import sys; from pipeline.driver.runlock import "
                    "RunLock; RunLock(sys.argv[1]).acquire()", str(out)], env=ENV, check=True)
    return json.loads((out / LOCK_NAME).read_text())["pid"]


@contextlib.contextmanager
def _held_by_another_job(out: Path, command: str):
    """A live process that holds ``out`` until the block ends; yields its pid."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pipeline.driver.runlock import RunLock\n"
         "with RunLock(sys.argv[1], command=sys.argv[2]):\n"
         "    print('held', flush=True); sys.stdin.read()", str(out), command],
        env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder.pid
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0


def _write_holder(out: Path, holder: runlock.Holder) -> None:
    (out / LOCK_NAME).write_text(json.dumps(dataclasses.asdict(holder)))


def test_held_for_the_block_and_released_after_an_error(tmp_path):
    out = tmp_path / "run"  # not there yet
    with pytest.raises(RuntimeError, match="boom"):
        with RunLock(out):
            record = json.loads((out / LOCK_NAME).read_text())
            assert (record["pid"], record["host"]) == (os.getpid(), socket.gethostname())
            assert record["proc_start"] == process_start(os.getpid()) is not None
            raise RuntimeError("boom")
    assert not (out / LOCK_NAME).exists()


def test_a_live_holder_is_named_and_keeps_the_lock(tmp_path):
    with _held_by_another_job(tmp_path, "python -m pipeline.train train.seed=7") as pid:
        before = (tmp_path / LOCK_NAME).read_text()
        with pytest.raises(RunLocked) as refused:
            RunLock(tmp_path).acquire()
        line = str(refused.value)
        assert f"pid {pid} on host {socket.gethostname()}" in line
        assert "train.seed=7" in line and "in use by another job" in line and "\n" not in line
        assert (tmp_path / LOCK_NAME).read_text() == before
    assert not (tmp_path / LOCK_NAME).exists()


def test_takes_nest_within_one_process(tmp_path):
    with RunLock(tmp_path) as outer:
        with RunLock(tmp_path) as inner:
            assert inner.holder == outer.holder
        assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == outer.holder.token
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_dead_holders_lock_is_taken_over_with_one_warning(tmp_path, caplog):
    dead = _left_by_a_dead_job(tmp_path)
    with caplog.at_level(logging.WARNING, logger=runlock.__name__):
        with RunLock(tmp_path):
            assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert f"pid {dead} on host" in warnings[0] and "no longer running" in warnings[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no marker or staged file left


def test_a_reused_pid_or_an_exited_process_does_not_hold_the_lock(tmp_path):
    me = this_process()
    assert is_running(me)
    # The record names a live pid, but that pid started at another time: it was reused.
    reused = dataclasses.replace(me, proc_start=me.proc_start - 1)
    assert not is_running(reused)
    _write_holder(tmp_path, reused)
    with RunLock(tmp_path) as lock:
        assert lock.holder.token != reused.token
    # Exited but not yet reaped (a zombie still answers kill(pid, 0)).
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    holder = dataclasses.replace(me, pid=child.pid, proc_start=process_start(child.pid))
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert not is_running(holder)
    child.wait()
    assert not is_running(holder)


def test_a_lock_from_another_host_is_refused_with_advice(tmp_path):
    _write_holder(tmp_path, dataclasses.replace(this_process(), host="node-b", pid=1))
    before = (tmp_path / LOCK_NAME).read_text()
    with pytest.raises(RunLocked, match="another host") as refused:
        RunLock(tmp_path).acquire()
    assert "node-b" in str(refused.value) and f"delete {tmp_path / LOCK_NAME}" in str(refused.value)
    assert (tmp_path / LOCK_NAME).read_text() == before


def test_an_unreadable_lock_is_refused_not_taken(tmp_path, monkeypatch):
    monkeypatch.setattr(runlock, "_WRITE_GRACE_S", 0.2)
    (tmp_path / LOCK_NAME).write_text("")
    with pytest.raises(RunLocked, match="unreadable"):
        RunLock(tmp_path).acquire()
    assert (tmp_path / LOCK_NAME).read_text() == ""


RACER = """
import sys, time
from pathlib import Path
from pipeline.driver.runlock import RunLock, RunLocked
out, ready, go, done = map(Path, sys.argv[1:])
ready.touch()
while not go.exists():
    time.sleep(0.001)
lock = RunLock(out)
try:
    lock.acquire()
except RunLocked as e:
    print("refused:", e, flush=True)
    sys.exit(0)
print("won", flush=True)
while not done.exists():
    time.sleep(0.01)
lock.release()
"""


@pytest.mark.parametrize("stale", [False, True], ids=["fresh", "stale"])
def test_jobs_started_together_have_exactly_one_winner(tmp_path, stale):
    out, n = tmp_path / "run", 4
    out.mkdir()
    if stale:
        _left_by_a_dead_job(out)
    go, done = tmp_path / "go", tmp_path / "done"
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(out), str(tmp_path / f"r{i}"),
                                str(go), str(done)], env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for i in range(n)]
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"r{i}").exists() for i in range(n)):
            assert time.monotonic() < deadline and all(r.poll() is None for r in racers)
            time.sleep(0.05)
        go.touch()
        # The losers exit at once; with two winners this waits out its limit, then fails below.
        settle = time.monotonic() + 30
        while sum(r.poll() is not None for r in racers) < n - 1 and time.monotonic() < settle:
            time.sleep(0.05)
    finally:
        done.touch()
        results = [r.communicate(timeout=60) for r in racers]
    winners = [r.pid for r, (o, _) in zip(racers, results) if o.strip() == "won"]
    assert len(winners) == 1, results
    refusals = [o for o, _ in results if o.startswith("refused:")]
    assert len(refusals) == n - 1 and all(f"pid {winners[0]} on host" in o for o in refusals)
    takeovers = sum("taking over" in e for _, e in results)
    assert takeovers == (1 if stale else 0), results
    assert not list(out.iterdir())  # released, and no marker or staged file left


def test_the_driver_refuses_a_held_folder_before_writing_anything(tiny_assets, tmp_path):
    from pipeline.driver.compose import compose_job
    from pipeline.driver.job import Driver

    out = tmp_path / "run"
    out.mkdir()
    job = compose_job(["train.plan.max_steps=2", f"train.out_dir={out}"])
    with _held_by_another_job(out, "the other job"):
        with pytest.raises(RunLocked, match="the other job"):
            Driver(job).run()
        assert [p.name for p in out.iterdir()] == [LOCK_NAME]



def test_a_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(RunLocked, match=r"train.out_dir=.*file/run.*cannot create the folder"):
        RunLock(tmp_path / "file" / "run").acquire()
