"""Actors kept across the jobs of one process (:func:`keep_actors`).

A job that closes cleanly releases its actors and placement groups here; the next job that
asks :func:`pipeline.runtime.ray_start.start_actor` for the same class in the same place gets the kept
process, built again by its constructor, instead of a new Ray worker that imports torch and
the model code anew. A restart after a loss, an interrupted job, a failed close, a new layout
and every CLI run still start new actors (they never release, or never keep).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import ray


class Key(NamedTuple):
    """What a kept actor can serve: the same class in the same place, under the environment
    its process was started with (a kept process keeps it)."""

    cls: type
    group: Optional[str]  # the placement group's id, None outside one
    bundle: int
    cpus: float
    gpus: float
    env: str  # the runtime_env, as JSON


# Idle kept actors by Key, the Key each live actor was started under, kept placement groups by
# their spec, and the Ray instance all of them belong to. None: actors are not kept.
_pool: Optional[dict[str, Any]] = None

# Kept actors outside any placement group (a prefetcher, an evaluator) hold their CPUs while
# idle: one a class, and this many in all, the oldest killed first.
_LOOSE_KEPT = 2


def keep_actors() -> None:
    """From now on in this process, actors a job closed cleanly are kept, with their placement
    groups, for the next job that asks for the same class in the same place."""
    global _pool
    _pool = {"gcs": None, "actors": {}, "born": {}, "groups": {}}


def live() -> Optional[dict[str, Any]]:
    """The pool, emptied when Ray was started again since (its handles are gone); None where
    actors are not kept or Ray is down."""
    if _pool is None or not ray.is_initialized():
        return None
    gcs = ray.get_runtime_context().gcs_address
    if _pool["gcs"] != gcs:
        _pool.update(gcs=gcs, actors={}, born={}, groups={})
    return _pool


def take_idle(pool: dict[str, Any], key: Key) -> Any:
    """A kept idle actor for ``key``, taken out of the pool, or None."""
    idle = pool["actors"].get(key)
    return idle.pop() if idle else None


def born(pool: dict[str, Any], handle: Any, key: Key) -> None:
    """``handle`` now serves a job under ``key``: it is kept when that job releases it."""
    pool["born"][handle._actor_id.hex()] = key


def clear_bundle(pool: dict[str, Any], key: Key) -> None:
    """Kill the idle kept actors in ``key``'s bundle (another class, another environment): they
    hold what a new actor there needs, which would wait for them forever."""
    for other in [k for k in pool["actors"] if (k.group, k.bundle) == (key.group, key.bundle)]:
        for stale in pool["actors"].pop(other):
            ray.kill(stale)


def forget(handles: list[Any]) -> None:
    """``handles`` are about to be killed: never keep them."""
    pool = live()
    if pool is not None:
        for handle in handles:
            pool["born"].pop(handle._actor_id.hex(), None)


def release_actors(handles: list[Any]) -> None:
    """Actors a job closed cleanly: kept for the next job where actors are kept, else killed."""
    pool = live()
    for handle in handles:
        key = pool["born"].pop(handle._actor_id.hex(), None) if pool is not None else None
        if key is None:
            ray.kill(handle)
            continue
        if key.group is None:
            loose = [k for k in pool["actors"] if k.group is None]
            same = [k for k in loose if k.cls is key.cls]
            others = [k for k in loose if k.cls is not key.cls]
            for old in same + others[:len(others) + 1 - _LOOSE_KEPT]:
                for idle in pool["actors"].pop(old):
                    ray.kill(idle)
        pool["actors"].setdefault(key, []).append(handle)


def kept_groups(spec: Any) -> Optional[list[Any]]:
    """Placement groups kept under ``spec`` (taken out of the pool); every other kept group
    is removed (its kept actors with it). None where none are kept."""
    pool = live()
    if pool is None:
        return None
    found = pool["groups"].pop(spec, None)
    _remove_kept_groups(pool)
    return found


def keep_groups(spec: Any, groups: list[Any]) -> bool:
    """Keep ``groups`` under ``spec`` where actors are kept (True), else False."""
    pool = live()
    if pool is None:
        return False
    pool["groups"][spec] = list(groups)
    return True


def _remove_kept_groups(pool: dict[str, Any]) -> None:
    """Remove every kept placement group; Ray kills the kept actors in them."""
    removed = set()
    for groups in pool["groups"].values():
        for group in groups:
            ray.util.remove_placement_group(group.pg)
            removed.add(group.pg.id.hex())
    pool["groups"] = {}
    pool["actors"] = {k: v for k, v in pool["actors"].items() if k.group not in removed}


def drop_kept_actors() -> None:
    """Kill every kept actor and remove every kept placement group (actors are still kept
    from now on)."""
    pool = live()
    if pool is None:
        return
    _remove_kept_groups(pool)
    for idle in pool["actors"].values():  # those outside a group
        for handle in idle:
            ray.kill(handle)
    pool["actors"] = {}
