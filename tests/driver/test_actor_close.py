"""A stopped job (Ctrl-C, SIGTERM) closes its actors within one grace period, then kills them:
an actor whose close never returns (a target behind a long queue, a drafter behind a stuck
checkpoint write) cannot keep the job from ending, and one that closes at once still does."""

import time
from pathlib import Path

import pytest
import ray
from ray.exceptions import RayActorError

from pipeline.runtime import stop_signals
from pipeline.driver.actors import ActorGroup
from pipeline.runtime.ray_start import Placement, kill_actors, start_actor


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
    # Ample for a close with nothing queued however loaded the machine, and far below the
    # 60 s each layer (drafters, then targets) waits when the job is not stopping.
    monkeypatch.setattr(stop_signals, "GRACE_S", 8.0)
    where = Placement(cpus=0.1)
    quick = start_actor(Closing, where, close_s=0.0, mark=str(tmp_path / "drafter"))
    stuck = start_actor(Closing, where, close_s=3600.0, mark=str(tmp_path / "target"))
    try:
        ray.get([quick.ready.remote(), stuck.ready.remote()], timeout=120)
        group = ActorGroup(job=None, resolved=None, dataset=None)
        group.drafters, group.drafter_node = [quick], [0]
        group.targets, group.chains, group.target_node = [stuck], [[stuck]], [0]
        t0 = time.monotonic()
        group.__exit__(KeyboardInterrupt, KeyboardInterrupt(), None)  # a `with` unwinding
        waited = time.monotonic() - t0
        assert waited < 40.0, waited
        assert (tmp_path / "drafter").exists() and not (tmp_path / "target").exists()
        with pytest.raises(RayActorError):
            ray.get(stuck.ready.remote(), timeout=60)
        assert group.drafters == group.targets == []
    finally:
        kill_actors([quick, stuck])
