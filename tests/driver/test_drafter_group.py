"""The drafter group's dispatch policy: which rank gets each call, and what comes back.

Most tests go through the group's ``calls`` seam with plain objects as replicas, so the policy
is checked without Ray; the last ones run the Ray path of a call sent to every rank (not used
by today's policy, but the one sharded drafters switch to), with real actors.
"""

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import ray

import pipeline
from pipeline.driver.drafter_group import OWNER_RANK, POLICY, Dispatch, DrafterGroup
from pipeline.runtime.ray_start import Placement, kill_actors, start_actor
from pipeline.workers.drafter_worker import DrafterWorker


@dataclass(frozen=True)
class Ref:
    """A finished call: what a ray.ObjectRef stands for in these tests."""

    value: object


@dataclass
class LocalCalls:
    """The group's seam, run in this process: a call runs at once and gives a Ref."""

    joins: int = 0

    def call(self, handle, method, *args):
        return Ref(getattr(handle, method)(*args))

    def get(self, refs):
        return [r.value for r in refs]

    def join(self, refs, collect):
        self.joins += 1
        return Ref(collect(self.get(refs)))


@dataclass
class Replica:
    """A drafter stand-in: records each call in the shared log; some values name its rank."""

    rank: int
    log: list = field(default_factory=list)
    steps_done: int = 4

    def _called(self, method):
        self.log.append((self.rank, method))

    def master_address(self):
        self._called("master_address")
        return f"address of {self.rank}"

    def startup_seconds(self):
        self._called("startup_seconds")
        return {"drafter built": float(self.rank)}

    def init_group(self, addr, port, timeout_s, write_threads=1):
        self._called("init_group")

    def load_checkpoint(self, folder):
        self._called("load_checkpoint")
        return self.steps_done

    def load_seconds(self):
        self._called("load_seconds")
        return {"read from the files": float(self.rank)}

    def save_checkpoint(self, folder):
        self._called("save_checkpoint")
        return float(self.rank)

    def wait_saves(self):
        self._called("wait_saves")
        return (f"saves of {self.rank}",)

    def weights(self, ring=False, reader_node=None):
        self._called("weights")
        return {"rank": self.rank}

    def export(self, out_dir, dtype):
        self._called("export")
        return f"{out_dir}/{self.rank}"


def _group(n=3, policy=POLICY):
    log: list = []
    replicas = [Replica(rank, log) for rank in range(n)]
    calls = LocalCalls()
    return DrafterGroup(replicas, policy, calls), replicas, log, calls


def _use_every_method(group):
    """Each group method once, as a run uses them; returns what came back."""
    got = {"master_address": group.master_address(),
           "startup_seconds": group.startup_seconds(),
           "init_group": group.init_group("host", 1, 5.0),
           "load_checkpoint": group.load_checkpoint("ckpt"),
           "load_seconds": group.load_seconds(),
           "save_checkpoint": group.save_checkpoint_ref("staging"),
           "wait_saves": group.wait_saves(),
           "weights": group.weights_ref(),
           "export": group.export("out", "float32")}
    assert set(got) == set(POLICY), "a group method is missing from this test"
    return got


def test_the_policy_names_only_drafter_worker_methods():
    for method in POLICY:
        assert callable(getattr(DrafterWorker, method, None)), method


def test_every_rank_saves_and_the_owner_alone_exports_and_hands_out_weights():
    """A save through torch.distributed.checkpoint is a collective: every rank enters it (and
    waits for its own write); the owner's value comes back."""
    group, _, log, calls = _group()
    got = _use_every_method(group)
    assert log == [(0, "master_address"), (0, "startup_seconds"),
                   (0, "init_group"), (1, "init_group"), (2, "init_group"),
                   (0, "load_checkpoint"), (1, "load_checkpoint"), (2, "load_checkpoint"),
                   (0, "load_seconds"),
                   (0, "save_checkpoint"), (1, "save_checkpoint"), (2, "save_checkpoint"),
                   (0, "wait_saves"), (1, "wait_saves"), (2, "wait_saves"),
                   (OWNER_RANK, "weights"), (OWNER_RANK, "export")]
    assert got["master_address"] == "address of 0" and got["load_checkpoint"] == 4
    assert got["startup_seconds"] == {"drafter built": 0.0}
    assert got["load_seconds"] == {"read from the files": 0.0}
    assert got["save_checkpoint"] == Ref(0.0) and got["weights"] == Ref({"rank": 0})
    assert got["wait_saves"] == ("saves of 0",) and got["export"] == "out/0"
    assert calls.joins == 1, "the save's refs of every rank are joined into one"


def test_replicas_that_disagree_are_caught():
    group, replicas, _, _ = _group()
    replicas[2].steps_done = 5
    with pytest.raises(AssertionError, match=r"disagree on load_checkpoint: \[4, 4, 5\]"):
        group.load_checkpoint("ckpt")


def test_switching_to_every_rank_changes_who_is_called_not_what_comes_back():
    """What sharded drafters change: one line per method in the policy, no caller."""
    today = _use_every_method(_group()[0])
    sharded = {**POLICY, **{m: Dispatch.EVERY_RANK for m in ("weights", "export")}}
    group, _, log, calls = _group(policy=sharded)
    assert _use_every_method(group) == today
    for method in ("save_checkpoint", "wait_saves", "weights", "export"):
        assert [rank for rank, m in log if m == method] == [0, 1, 2], method
    assert calls.joins == 2, "each ref method sent to every rank is one joined ref"


def test_one_drafter_under_every_rank_gets_its_own_ref():
    group, _, log, calls = _group(n=1, policy={**POLICY, "weights": Dispatch.EVERY_RANK})
    assert group.weights_ref() == Ref({"rank": 0}) and calls.joins == 0
    assert log == [(0, "weights")]


def test_no_driver_module_picks_a_drafter_by_index():
    """The policy lives in drafter_group.py only: no caller picks drafter 0 by hand."""
    driver = Path(pipeline.__file__).parent / "driver"
    found = [f"{p.name}:{n}" for p in sorted(driver.glob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if "drafters[0]" in line or "drafter 0" in line]
    assert not found, found


# -- the Ray path of a call to every rank ---------------------------------------------------

class RayReplica:
    def __init__(self, rank: int, fail: bool = False) -> None:
        self.rank, self.fail, self.saves = rank, fail, 0

    def save_checkpoint(self, folder: str) -> float:
        if self.fail:
            raise OSError(f"rank {self.rank} cannot write {folder}")
        self.saves += 1
        return float(self.rank)

    def saves_done(self) -> int:
        return self.saves


def test_a_ref_sent_to_every_rank_waits_for_all_and_keeps_their_failures(ray_session):
    where = Placement(cpus=0.1)
    every = {**POLICY, "save_checkpoint": Dispatch.EVERY_RANK}
    good = [start_actor(RayReplica, where, rank=r) for r in range(2)]
    bad = [start_actor(RayReplica, where, rank=0), start_actor(RayReplica, where, rank=1,
                                                                 fail=True)]
    try:
        assert ray.get(DrafterGroup(good, every).save_checkpoint_ref("f")) == 0.0
        assert ray.get([h.saves_done.remote() for h in good]) == [1, 1]
        with pytest.raises(OSError, match="rank 1 cannot write f"):
            ray.get(DrafterGroup(bad, every).save_checkpoint_ref("f"))
    finally:
        kill_actors(good + bad)
