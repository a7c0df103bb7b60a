"""Actors kept across jobs (pipeline.runtime.actor_pool.keep_actors): a cleanly released actor is built
again in its own process for the next request of its class in the same place, with none of
the old object's state, and only under the environment it was started with; a constructor that
fails there fails as in a new actor; without keeping, a released actor is killed."""

import os
import time

import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group

from pipeline.runtime import actor_pool
from pipeline.runtime.actor_pool import release_actors
from pipeline.runtime.ray_start import Placement, start_actor


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


def _dead(actor, timeout_s: float = 30.0) -> bool:
    """Whether ``actor`` is gone within ``timeout_s`` (ray.kill is asynchronous: a call sent
    at once may still be answered)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.state.remote())
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.RayTaskError:
            pass  # alive, its object emptied by a failed rebuild
        time.sleep(0.2)
    return False


@pytest.fixture()
def group(ray_session):
    pg = placement_group([{"CPU": 0.25}])
    ray.get(pg.ready())
    kept = actor_pool._pool
    yield Placement(cpus=0.25, group=pg, bundle=0)
    actor_pool._pool = kept
    remove_placement_group(pg)


def test_a_released_actor_is_built_again_in_its_process(group):
    actor_pool.keep_actors()
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
    assert _dead(again)  # the kept one was killed, not handed out twice


def test_a_kept_actor_serves_only_the_environment_it_was_started_with(group, monkeypatch):
    """A process keeps the environment it started with: a request under another (a variable
    actors are given changed since) gets a new process, and the kept one is not handed out."""
    actor_pool.keep_actors()
    first = start_actor(Counter, group, start=1)
    pid, _ = ray.get(first.state.remote())
    release_actors([first])
    monkeypatch.setenv("WANDB_MODE", "changed-for-this-test")
    other = start_actor(Counter, group, start=2)
    other_pid, _ = ray.get(other.state.remote())
    assert other_pid != pid
    assert ray.get(other.__ray_call__.remote(lambda self: os.environ["WANDB_MODE"])) == \
        "changed-for-this-test"
    ray.kill(other)
    actor_pool.drop_kept_actors()
    assert _dead(first)


def test_without_keeping_a_released_actor_is_killed(group):
    actor_pool._pool = None
    actor = start_actor(Counter, group, start=1)
    ray.get(actor.step.remote())
    release_actors([actor])
    assert _dead(actor)


class Other(Counter):
    pass


class Third(Counter):
    pass


def test_actors_outside_a_group_are_kept_one_a_class_two_in_all(ray_session):
    """They hold their CPUs while idle: a class's newest replaces its last (and no other), and
    the oldest goes once a third is kept."""
    kept = actor_pool._pool
    actor_pool.keep_actors()
    try:
        actors = [start_actor(cls, Placement(cpus=cpus), start=0)
                  for cls, cpus in ((Counter, 0.25), (Counter, 0.5), (Other, 0.25),
                                    (Third, 0.25), (Third, 0.5))]
        ray.get([a.step.remote() for a in actors])
        first, second, other, third, third_again = actors
        release_actors([first])
        release_actors([second])  # the same class: the first one goes
        assert _dead(first)
        release_actors([other])
        assert ray.get([second.step.remote(), other.step.remote()]) == [2, 2]  # both kept
        release_actors([third])  # a third: the oldest, second, goes
        assert _dead(second)
        assert ray.get([other.step.remote(), third.step.remote()]) == [3, 2]
        release_actors([third_again])  # replaces third; other, the older, stays
        assert _dead(third)
        assert ray.get([other.step.remote(), third_again.step.remote()]) == [4, 2]
    finally:
        actor_pool.drop_kept_actors()
        actor_pool._pool = kept
