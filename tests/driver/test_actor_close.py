"""A stopped job (Ctrl-C, SIGTERM) closes its actors within one grace period, then kills them:
an actor whose close never returns (a drafter behind a stuck checkpoint write, a target behind
a long queue) cannot keep the job from ending, and an actor that closes at once still does."""

import time
from pathlib import Path

import pytest
import ray
from ray.exceptions import RayActorError

from pipeline.driver import actors as actors_module
from pipeline.driver import stop_signals
from pipeline.driver.actors import ActorGroup
from pipeline.ray_start import Placement, kill_actors, start_actor


class Closing:
    """An actor whose close takes ``close_s``, then leaves ``mark`` behind."""

    def __init__(self, close_s: float, mark: str) -> None:
        self.close_s, self.mark = close_s, mark

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        time.sleep(self.close_s)
        Path(self.mark).touch()


def test_a_stopped_job_kills_what_did_not_close_within_the_grace(ray_session, tmp_path,
                                                                  monkeypatch):
    monkeypatch.setattr(stop_signals, "GRACE_S", 1.0)
    where = Placement(cpus=0.1)
    stuck = start_actor(Closing, where, close_s=3600.0, mark=str(tmp_path / "drafter"))
    quick = start_actor(Closing, where, close_s=0.0, mark=str(tmp_path / "target"))
    try:
        ray.get([stuck.ready.remote(), quick.ready.remote()], timeout=120)
        group = ActorGroup(job=None, resolved=None, dataset=None)
        group.drafters, group.drafter_node = [stuck], [0]
        group.targets, group.chains, group.target_node = [quick], [[quick]], [0]
        t0 = time.monotonic()
        group.__exit__(KeyboardInterrupt, KeyboardInterrupt(), None)  # a `with` unwinding
        waited = time.monotonic() - t0
        # The grace, and the least wait of the targets' layer (a closed ring is unlinked);
        # a close with its own limit (60 s a layer) would still be waiting.
        assert waited < 1.0 + 2 * actors_module._LEAST_WAIT_S + 10.0, waited
        assert (tmp_path / "target").exists() and not (tmp_path / "drafter").exists()
        with pytest.raises(RayActorError):
            ray.get(stuck.ready.remote(), timeout=60)
        assert group.drafters == group.targets == []
    finally:
        kill_actors([stuck, quick])
