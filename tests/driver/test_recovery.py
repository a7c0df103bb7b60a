"""A lost actor costs a restart, not the job: kill each kind of actor mid-run, by ray.kill or
SIGKILL of its process; the driver restarts the set from the last checkpoint and every sample
is still trained exactly once per epoch."""

import json
import logging
import re
import os
import signal
import time

import pytest
import ray

from pipeline.checkpoint import folders as ckpt
from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver

# 24 samples, 2 per micro-batch, 2 drafters: 6 steps per epoch; 2 epochs; a save every 2 steps.
BASE = ["cluster.cpus_per_actor=0.5", "train.eval.every=-1", "train.export_dtype=float32",
        "data.micro_batch_size=2", "train.optim.lr=2e-3", "train.plan.epochs=2",
        "train.checkpoint.every=2", "train.log_every=100"]


def _kill_at(driver, step, kind, how, seen=()):
    """A step listener that kills an actor of ``kind`` once ``step`` steps are done (``seen``:
    the watcher's entries, whose index at the kill it records)."""
    state = {}

    def listener(done):
        if done != step or state:
            return
        actors = driver.actors
        handle = {"drafter": actors.drafters[-1], "target": actors.targets[0],
                  "prefetcher": actors.prefetcher}[kind]
        if how == "ray.kill":
            ray.kill(handle)
        else:
            pid = ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))
            os.kill(pid, signal.SIGKILL)
        state["killed_at"] = time.time()
        state["entry"] = len(seen) - 1
    listener.state = state
    return listener


def _train_rows(out_dir):
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "train/loss" in r]


# Early enough that the actor still has work pending (the prefetcher runs 3 steps ahead).
KILLS = [(2, "prefetcher", "SIGKILL"), (5, "drafter", "SIGKILL"), (8, "target", "ray.kill")]


@pytest.fixture(scope="module")
def killed_three_times(ray_cluster, small_train_file, tmp_path_factory):
    """One job of 2 epochs in which each kind of actor is killed once (KILLS), watched after
    every step: (out_dir, summary, killers, seen, log). Both tests below read it: the second
    one's drafter-only restart is the drafter kill of this job (one job instead of two)."""
    out = tmp_path_factory.mktemp("recovery") / "run"
    driver = Driver(compose_job(BASE + [f"data.train_path={small_train_file}",
                                        f"train.out_dir={out}", "train.recovery.max_restarts=3",
                                        "train.checkpoint.keep_last=2"]))
    seen = []

    def watch(done):  # which target and prefetcher trained each step (before any kill there)
        seen.append((done, driver.actors.targets[0]._actor_id,
                     driver.actors.prefetcher._actor_id))
    driver.step_listeners.append(watch)
    killers = [_kill_at(driver, step, kind, how, seen) for step, kind, how in KILLS]
    driver.step_listeners.extend(killers)
    handler = _Capture()
    logging.getLogger().addHandler(handler)
    level = logging.getLogger().level
    logging.getLogger().setLevel(logging.INFO)
    try:
        summary = driver.run()
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(level)
    return out, summary, killers, seen, "\n".join(handler.lines)


class _Capture(logging.Handler):
    """The job's log lines (caplog is function-scoped; the job is the module's)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_each_kind_of_killed_actor_is_restarted_from_the_last_checkpoint(killed_three_times):
    out, summary, killers, _, log = killed_three_times
    assert [r.actor.split()[0] for r in summary.restarts] == [kind for _, kind, _ in KILLS]
    for (step, kind, how), rec, killer in zip(KILLS, summary.restarts, killers):
        killed_at = killer.state["killed_at"]
        # Resumed from the newest complete checkpoint: at least the one before the kill.
        assert rec.resumed_step >= 2 * ((step - 1) // 2) and rec.resumed_step < 12
        if rec.resumed_step:
            assert rec.checkpoint.endswith(f"step_{rec.resumed_step:08d}")
        assert killed_at <= rec.detected_at <= rec.restarted_at <= rec.training_at
        # Where the restart went, part by part, within the time it took; a lost drafter
        # restarts the drafters only, anything else the whole set.
        first = ("drafters killed and data re-planned" if kind == "drafter"
                 else "actor set closed and started")
        assert list(rec.phases) == [first, "drafters built", "process group and rings",
                                    "checkpoint loaded"]
        assert all(v >= 0 for v in rec.phases.values())
        assert sum(rec.phases.values()) <= rec.restarted_at - rec.detected_at
        assert "checkpoint loaded" in log
        assert f"lost {rec.actor}" in log
        assert f"resuming from step {rec.resumed_step}" in log
        logging.getLogger(__name__).warning(
            "%s killed by %s after step %d: seen after %.1fs, actors up again after %.1fs, "
            "training again after %.1fs (from the kill), resumed from step %d", kind, how, step,
            rec.detected_at - killed_at, rec.restarted_at - killed_at,
            rec.training_at - killed_at, rec.resumed_step)
    # Each restart's drafters were told the checkpoint they load, and read it while starting
    # (train.checkpoint.read_ahead's default under drafter.parallel=replicate).
    loads = re.findall(r"resumed from \S+ at step (\d+) \(drafter rank 0: (.*)\)", log)
    assert [int(step) for step, _ in loads] == [r.resumed_step for r in summary.restarts
                                                if r.resumed_step]
    assert all(re.fullmatch(r"waited for the read-ahead [0-9.]+s, copied from host memory "
                            r"[0-9.]+s", parts) for _, parts in loads), loads
    # Drafter rank 0's start-up, at the job's start and after each restart (every kind restarts
    # the drafters): its parts in order, adding up to the time since it was asked for.
    ups = re.findall(r"drafter rank 0 up ([0-9.]+)s after it was asked for \((.*)\)", log)
    assert len(ups) == 1 + len(KILLS), ups
    for up, listed in ups:
        parts = re.findall(r"(.+?) ([0-9.]+)s(?:, |$)", listed)
        assert [name for name, _ in parts] == [
            "before its constructor", "device ready", "drafter built",
            "waited for the target head", "optimizer and compile set up", "rest"], listed
        # Each figure rounded to 0.1 s: the parts add up to the whole within the roundings.
        assert abs(sum(float(v) for _, v in parts) - float(up)) <= 0.05 * (len(parts) + 1)
    # Both epochs complete, each sample trained exactly once in each, and the line says so.
    assert summary.end_step == 12 and len(summary.losses) == 12
    assert [a.epoch for a in summary.accounts] == [0, 1]
    for account in summary.accounts:
        assert account.exact and account.trained == 24
    assert summary.accounts[-1].restarts == 3 and "trained again" in log
    assert summary.checksums_agree
    # The metrics hold every step; the last row of each step is the one that counts.
    assert sorted({r["step"] for r in _train_rows(out)}) == list(range(1, 13))
    assert ckpt.latest(out).name == "step_00000012"
    assert sorted(p.name for p in ckpt.checkpoint_root(out).iterdir()) == [
        "step_00000010", "step_00000012"]  # keep_last=2, and no staging folder left
    assert (out / "export" / "model.safetensors").exists()


def test_a_lost_drafter_restarts_the_drafters_only(killed_three_times):
    """The target (slowest to load) and the prefetcher (data already tokenized) stay; the
    drafters come back from the checkpoint and retrain the lost steps to the same losses.
    The drafter killed after step 5 of the shared job (between the prefetcher's and the
    target's restarts, which replace the whole set)."""
    out, summary, killers, seen, _ = killed_three_times
    rec = summary.restarts[1]
    # The newest checkpoint: step 4, or step 6 when step 6 completed before the loss was seen.
    assert rec.actor.startswith("drafter") and rec.resumed_step in (4, 6)
    # The same target and prefetcher from the drafter's kill until the target's kill (the
    # entry of that step is written before the target dies).
    first, last = killers[1].state["entry"], killers[2].state["entry"]
    assert last - first >= 2 and seen[first][0] == 5, seen
    assert len({entry[1:] for entry in seen[first:last + 1]}) == 1, seen
    # The steps closed both before the drafters' restart and after it (the step count goes
    # back there), up to the target's kill: trained again, to the same losses.
    back = next(i for i in range(first + 1, last + 1) if seen[i][0] <= seen[i - 1][0])
    repeated = sorted({e[0] for e in seen[first:back]} & {e[0] for e in seen[back:last + 1]})
    assert repeated and all(s > rec.resumed_step for s in repeated), (rec, seen)
    twice = {}
    for row in _train_rows(out):
        twice.setdefault(row["step"], []).append(row["train/loss"])
    for step in repeated:  # rows in the order trained: the first try, then the retrain
        assert twice[step][1] == pytest.approx(twice[step][0], rel=1e-6), step


def test_a_lost_actor_ends_the_job_when_no_restart_is_left(ray_cluster, small_train_file,
                                                           tmp_path, caplog):
    # One drafter (of 4 samples a micro-batch: the 6 steps of the others): the loss of the
    # only one ends the job as the loss of one of two does.
    driver = Driver(compose_job(BASE + [f"data.train_path={small_train_file}",
                                        f"train.out_dir={tmp_path / 'run'}",
                                        "train.recovery.max_restarts=0",
                                        "cluster.drafters_per_node=1", "data.micro_batch_size=4",
                                        "train.plan.epochs=1"]))
    driver.step_listeners.append(_kill_at(driver, 2, "drafter", "ray.kill"))
    with pytest.raises(ray.exceptions.RayError):
        driver.run()
    assert "no restart left (train.recovery.max_restarts=0)" in caplog.text


class _Peer:
    def fail(self) -> None:
        raise RuntimeError("peer closed the connection")  # as gloo says when a peer died

    def ping(self) -> int:
        return 1


def _wait_dead(actor, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=timeout_s)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers")


def test_a_peer_error_is_traced_to_the_dead_actor_even_with_nothing_pending(ray_session):
    """A survivor's task error comes first; the dead actor has no call pending: the probe
    finds it. A task error with every actor alive is a bug, not a loss."""
    from pipeline.driver.recovery import lost_actor

    alive, dead = ray.remote(_Peer).remote(), ray.remote(_Peer).remote()
    names = {alive._actor_id.hex(): "drafter 0", dead._actor_id.hex(): "drafter 1"}
    try:
        with pytest.raises(ray.exceptions.RayTaskError) as err:
            ray.get(alive.fail.remote())
        assert lost_actor(err.value, [], names, [alive, dead], grace_s=20) is None
        ray.get(dead.ping.remote())
        ray.kill(dead)
        _wait_dead(dead)  # ray.kill is asynchronous: a probe sent at once may still succeed
        assert lost_actor(err.value, [], names, [alive, dead], grace_s=20) == "drafter 1"
        assert lost_actor(ValueError("a bug"), [], names, [alive, dead]) is None
    finally:
        ray.kill(alive)
