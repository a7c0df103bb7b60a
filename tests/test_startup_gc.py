"""Full garbage collections wait while a process of ours starts: in an actor from its first
import of our package until its constructor returns, then the thresholds are Python's again
and a cycle made during start-up is still collected; nothing changes in a process that did
not ask."""

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import ray

from pipeline.runtime import startup_gc
from pipeline.runtime.ray_start import Placement, actor_env, start_actor

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import gc, json, os, sys
before = gc.get_threshold()
import pipeline
from pipeline.runtime import startup_gc
deferred = gc.get_threshold()
class Node:
    pass
cycle = Node()
cycle.me = cycle
import weakref
ref = weakref.ref(cycle)
del cycle
startup_gc.started()
gc.collect()
print(json.dumps({"before": before, "deferred": deferred, "after": gc.get_threshold(),
                  "cycle_freed": ref() is None, "env": os.environ.get(startup_gc.ENV_VAR)}))
"""


def _probe(**env):
    base = {k: v for k, v in os.environ.items() if k != startup_gc.ENV_VAR}
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_importing_the_package_defers_full_collections_only_when_asked():
    asked = _probe(**{startup_gc.ENV_VAR: "1"})
    assert asked["deferred"][:2] == asked["before"][:2]  # young generations as before
    assert asked["deferred"][2] > 1_000_000 > asked["before"][2]
    assert asked["after"] == asked["before"] and asked["cycle_freed"]
    assert asked["env"] is None  # not passed on to the processes this one starts
    plain = _probe()
    assert plain["deferred"] == plain["before"] == plain["after"]


def test_actors_are_asked_to_defer():
    assert actor_env()[startup_gc.ENV_VAR] == "1"


class GcProbe:
    def __init__(self):
        self.building = gc.get_threshold()

    def state(self):
        return dict(building=self.building, built=gc.get_threshold(),
                    env=os.environ.get(startup_gc.ENV_VAR))


def test_an_actor_collects_fully_again_once_built(ray_session):
    actor = start_actor(GcProbe, Placement(cpus=0.1))
    got = ray.get(actor.state.remote())
    ray.kill(actor)
    assert got["building"][2] > 1_000_000
    assert got["built"][:2] == got["building"][:2] and got["built"][2] < 1_000_000
    assert got["env"] is None
