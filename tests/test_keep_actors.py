"""Actors kept across jobs (pipeline.ray_start.keep_actors): a cleanly released actor is built
again in its own process for the next request of its class in the same place, with none of
the old object's state; a constructor that fails there fails as in a new actor; without
keeping, a released actor is killed."""

import os

import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group

from pipeline import ray_start
from pipeline.ray_start import Placement, release_actors, start_actor


class Counter:
    def __init__(self, *, start: int, fail: bool = False) -> None:
        if fail:
            raise ValueError(f"no counter from {start}")
        self.n = start

    def step(self) -> int:
        self.n += 1
        return self.n

    def state(self) -> tuple[int, list[str]]:
        return os.getpid(), sorted(vars(self))


@pytest.fixture()
def group(ray_session):
    pg = placement_group([{"CPU": 0.25}])
    ray.get(pg.ready())
    kept = ray_start._pool
    yield Placement(cpus=0.25, group=pg, bundle=0)
    ray_start._pool = kept
    remove_placement_group(pg)


def test_a_released_actor_is_built_again_in_its_process(group):
    ray_start.keep_actors()
    first = start_actor(Counter, group, start=1)
    assert ray.get(first.step.remote()) == 2
    pid, _ = ray.get(first.state.remote())
    release_actors([first])
    again = start_actor(Counter, group, start=10)
    assert ray.get(again.state.remote()) == (pid, ["n"])  # same process, a new object
    assert ray.get(again.step.remote()) == 11
    # Another place is another process.
    other = start_actor(Counter, Placement(cpus=0.25), start=0)
    assert ray.get(other.state.remote())[0] != pid
    ray.kill(other)
    release_actors([again])
    # A constructor that fails in the kept process fails as a new actor's does.
    broken = start_actor(Counter, group, start=7, fail=True)
    with pytest.raises(ray.exceptions.RayActorError, match="no counter from 7"):
        ray.get(broken.step.remote())
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(again.step.remote())  # the kept one was killed, not handed out twice


def test_without_keeping_a_released_actor_is_killed(group):
    ray_start._pool = None
    actor = start_actor(Counter, group, start=1)
    ray.get(actor.step.remote())
    release_actors([actor])
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actor.step.remote())
