"""A job that can never be placed on the Ray cluster is refused in one line before any actor
starts; one that waits for resources held by others says so, and gives up in one line.

The fit check is a pure function of the config and the live nodes' resources; the driver test
uses the suite's real local Ray (8 CPUs) with a job that asks for more.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group

from pipeline.job.config import ClusterConfig
from pipeline.driver import evaluator as evaluator_module
from pipeline.driver import job as job_module
from pipeline.driver.compose import compose_job
from pipeline.driver.evaluator import TauEvaluator
from pipeline.driver.job import Driver
from pipeline.driver.placement import NotPlaced, check_placement, job_asks, wait_placed
from pipeline.eval.config import EvalConfig
from pipeline.checks.preflight import PreflightError
from pipeline.runtime.ray_start import Placement, kill_actors, start_actor

EVAL_ON = EvalConfig(every=0, prompts=16, gpus=0.1)
EVAL_OFF = EvalConfig(every=-1)
# conf/cluster/local.yaml: 1 target + 2 drafters at 0.5 CPU; with the prefetcher and the
# evaluator, 5 actors.
LOCAL = ClusterConfig(device="cpu", targets_per_node=1, drafters_per_node=2, cpus_per_actor=0.5)


def _refusal(cfg, eval_cfg, device, nodes, stages=1) -> str:
    with pytest.raises(PreflightError) as err:
        check_placement(cfg, eval_cfg, device, nodes, stages)
    line = str(err.value)
    assert "\n" not in line and line.startswith("the job can never be placed")
    return line


def test_the_launchers_asks_are_listed_per_node_sized_piece():
    asks = job_asks(LOCAL, EVAL_ON, "cpu")
    assert [(a.cpus, a.gpus) for a in asks] == [(1.5, 0.0), (0.5, 0.0), (0.5, 0.0)]
    gpu = ClusterConfig(device="cuda", num_nodes=2, targets_per_node=1, drafters_per_node=1,
                        cpus_per_actor=4, gpus_per_actor=0.45)
    asks = job_asks(gpu, EVAL_ON, "cuda", stages=2)  # a target of 2 stages: 3 bundles a node
    assert [(a.cpus, round(a.gpus, 4)) for a in asks] == [(12, 1.35), (12, 1.35), (4, 0),
                                                          (4, 0.1)]
    assert len(job_asks(LOCAL, EVAL_OFF, "cpu")) == 2  # no evaluator starts


def test_the_readme_job_on_a_2_cpu_head_is_refused_naming_need_have_and_key():
    """The issue's case: `ray start --head --num-cpus=2`, the default job (5 x 0.5 CPU)."""
    line = _refusal(LOCAL, EVAL_ON, "cpu", [{"CPU": 2.0, "memory": 1e10}])
    assert "asks 2.5 CPUs in all" in line and "have 2 CPUs;" in line
    assert "5 actors x cluster.cpus_per_actor=0.5" in line
    assert "cluster.cpus_per_actor=0.4 or less" in line  # 5 x 0.4 = 2 fits
    assert "train.eval.every=-1" in line and "cluster.drafters_per_node" in line
    check_placement(LOCAL, EVAL_ON, "cpu", [{"CPU": 2.5}])  # exactly enough
    check_placement(LOCAL, EVAL_OFF, "cpu", [{"CPU": 2.0}])  # no evaluator: 4 x 0.5
    check_placement(replace(LOCAL, cpus_per_actor=0.4), EVAL_ON, "cpu", [{"CPU": 2}])


def test_a_node_group_larger_than_every_node_is_refused_though_the_total_fits():
    cfg = replace(LOCAL, cpus_per_actor=1.0)  # a group of 3 CPUs on one node
    line = _refusal(cfg, EVAL_ON, "cpu", [{"CPU": 2.0}] * 4)
    assert "node 0's placement group (3 x {CPU: 1}, kept on one node) asks {CPU: 3}" in line
    assert "no live node has that much (nodes: [{CPU: 2}, {CPU: 2}, {CPU: 2}, {CPU: 2}])" in line
    assert "cluster.cpus_per_actor=0.66 or less" in line
    check_placement(cfg, EVAL_ON, "cpu", [{"CPU": 3.0}, {"CPU": 2.0}])


def test_gpu_asks_must_find_their_cpus_on_a_gpu_node():
    """cluster=one_gpu (4 CPUs an actor) on a GPU node of 8 CPUs: 16 CPUs asked."""
    one_gpu = ClusterConfig(device="cuda", targets_per_node=1, drafters_per_node=1,
                            cpus_per_actor=4, gpus_per_actor=0.45)
    line = _refusal(one_gpu, EVAL_ON, "cuda", [{"CPU": 8.0, "GPU": 1.0}])
    assert "asks 16 CPUs in all" in line and "cluster.cpus_per_actor=2 or less" in line
    assert "cluster.gpus_per_actor" in line
    # CPUs on a node without the GPU do not help the group.
    line = _refusal(one_gpu, EVAL_OFF, "cuda", [{"CPU": 4.0, "GPU": 1.0}, {"CPU": 64.0}])
    assert "node 0's placement group (2 x {CPU: 4, GPU: 0.45}" in line
    check_placement(one_gpu, EVAL_ON, "cuda", [{"CPU": 16.0, "GPU": 1.0}])


@pytest.fixture()
def no_actor_may_start(monkeypatch):
    def started(*args, **kwargs):
        raise AssertionError("an actor was started")
    monkeypatch.setattr(job_module, "ActorGroup", started)
    monkeypatch.setattr(job_module, "TauEvaluator", started)


def test_the_driver_refuses_a_job_larger_than_the_real_local_ray(ray_cluster, tiny_assets,
                                                                  tmp_path, no_actor_may_start):
    """The suite's local Ray has 8 CPUs: 5 actors at 2 CPUs each never fit."""
    total = ray.cluster_resources()["CPU"]
    driver = Driver(compose_job(["cluster.cpus_per_actor=2", f"train.out_dir={tmp_path}"]))
    with pytest.raises(PreflightError) as err:
        driver.run()
    line = str(err.value)
    assert "\n" not in line
    assert "asks 10 CPUs in all" in line and f"have {total:g} CPUs;" in line


def test_the_driver_refuses_too_many_nodes_in_one_line(ray_cluster, tiny_assets, tmp_path,
                                                       no_actor_may_start):
    """Refused up front before, but as a traceback from the CLI: now a PreflightError."""
    with pytest.raises(PreflightError, match=r"cluster.num_nodes=3 but the Ray cluster has 1"):
        Driver(compose_job(["cluster.num_nodes=3", f"train.out_dir={tmp_path}"])).run()


def test_a_wait_for_held_resources_says_so_and_gives_up_in_one_line(ray_cluster, caplog):
    pg = placement_group([{"CPU": 1000.0}])  # more than the cluster has: never placed
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline.driver.placement"):
            with pytest.raises(NotPlaced) as err:
                wait_placed(pg.ready(), "a test group (1 x {CPU: 1000}) to be placed",
                            timeout_s=3.0, every_s=0.5)
    finally:
        remove_placement_group(pg)
    line = str(err.value)
    assert "\n" not in line and isinstance(err.value, PreflightError)  # exit 2, one line
    assert line.startswith("gave up waiting for a test group (1 x {CPU: 1000}) to be placed "
                           "after 3s: the Ray cluster has {CPU: ")
    assert "cluster.placement_timeout_s" in line
    waits = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert waits and all("a test group" in w and " free of {CPU: " in w for w in waits)


def test_a_ready_ref_passes_at_once(ray_cluster):
    wait_placed(ray.put(1), "an object", timeout_s=60.0)


class _Idle:
    def __init__(self) -> None:
        pass


def test_an_evaluator_without_room_ends_in_one_line(ray_session, monkeypatch):
    """Its wait, once a ValueError the CLI showed as a traceback, is a NotPlaced: one line."""
    monkeypatch.setattr(evaluator_module, "_PLACE_TIMEOUT_S", 1.0)
    evaluator = TauEvaluator(compose_job([]), resolved=None, prompts=list)
    evaluator.actor = start_actor(_Idle, Placement(cpus=1000.0))  # more than any node has
    try:
        with pytest.raises(NotPlaced, match=r"^the tau evaluator .* found no room in 1s"):
            evaluator.wait_ready()
    finally:
        kill_actors([evaluator.actor])
