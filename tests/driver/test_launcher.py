"""Impossible GPU layouts are refused before any actor starts; the cluster decides the device.

The layout check is a pure function of the config and the nodes' GPU counts, so these run on
CPU without Ray; the last tests use the suite's real local Ray (no GPUs) through the Driver.
"""

from __future__ import annotations

import pytest
import ray

from pipeline.job.config import ClusterConfig
from pipeline.driver import job as job_module
from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver
from pipeline.driver.launcher import check_cluster, check_gpu_layout, evaluator_gpus
from pipeline.eval.config import EvalConfig
from pipeline.job.resolve import cluster_device

EVAL_ON = EvalConfig(every=0, prompts=16, gpus=0.1)
EVAL_OFF = EvalConfig(every=-1)


def _cluster(targets=1, drafters=1, gpus=1.0, nodes=1) -> ClusterConfig:
    return ClusterConfig(device="cuda", num_nodes=nodes, targets_per_node=targets,
                         drafters_per_node=drafters, gpus_per_actor=gpus)


def test_the_evaluator_takes_a_gpu_fraction_only_when_eval_is_on():
    assert evaluator_gpus(EVAL_ON) == 0.1
    assert evaluator_gpus(EVAL_OFF) == 0.0
    assert evaluator_gpus(EvalConfig(every=5, prompts=0)) == 0.0


@pytest.mark.parametrize("cluster,node_gpus", [
    (_cluster(1, 7, 0.875), [8]),          # node8: the evaluator beside an actor
    (_cluster(1, 1, 0.45), [1]),           # one_gpu: target, drafter, evaluator on one GPU
    (_cluster(1, 1, 0.6), [2]),            # 2 x 0.6 on 2 GPUs, the evaluator beside one
    (_cluster(1, 7, 1.0), [9]),            # whole GPUs, the evaluator on the 9th
    (_cluster(1, 1, 0.45, nodes=2), [1, 1]),   # a group per 1-GPU node: drafters apart
    (_cluster(1, 1, 1.0, nodes=2), [2, 2, 1]),  # the evaluator on the node left over
])
def test_layouts_that_pack_onto_whole_gpus_pass(cluster, node_gpus):
    check_gpu_layout(cluster, EVAL_ON, node_gpus)


@pytest.mark.parametrize("cluster,node_gpus", [
    (_cluster(2, 1, 0.6), [2]),            # sum 1.8 <= 2, but a GPU holds one at 0.6
    (_cluster(2, 1, 0.45), [1]),           # 3 x 0.45 = 1.35 on one GPU
    (_cluster(1, 7, 1.0), [8]),            # 8 whole GPUs taken: no room for the evaluator
    (_cluster(1, 7, 0.95), [8]),           # 0.95 + 0.1 > 1 on every GPU
    (_cluster(1, 1, 1.0, nodes=2), [2, 0]),  # the second node has no GPU
])
def test_layouts_that_do_not_pack_are_refused_naming_the_keys(cluster, node_gpus):
    with pytest.raises(ValueError, match=r"cluster.targets_per_node=\d.*cluster.drafters_per_"
                                         r"node=\d.*cluster.gpus_per_actor=.*train.eval.gpus=0.1"
                                         r".*do not pack onto whole GPUs.*live nodes have \["):
        check_gpu_layout(cluster, EVAL_ON, node_gpus)


def test_a_layout_that_fits_only_without_the_evaluator_passes_with_eval_off():
    check_gpu_layout(_cluster(1, 7, 1.0), EVAL_OFF, [8])
    with pytest.raises(ValueError, match="at most 7 actors per node"):
        check_gpu_layout(_cluster(1, 7, 1.0), EVAL_ON, [8])


@pytest.mark.parametrize("node_gpus", [[1], [2], [8]])
def test_two_drafters_that_may_share_a_gpu_are_refused(node_gpus):
    # Even with a GPU per actor to spare: Ray, not us, picks each fractional bundle's GPU.
    with pytest.raises(ValueError, match=r"cluster.drafters_per_node=2 .* cluster.gpus_per_"
                                         r"actor=0.45 .*Duplicate GPU.*gpus_per_actor > 0.5.*"
                                         r"cluster.drafters_per_node=1"):
        check_gpu_layout(_cluster(1, 2, 0.45), EVAL_OFF, node_gpus)


def test_two_groups_that_may_land_on_one_node_with_shared_gpus_are_refused():
    with pytest.raises(ValueError, match=r"cluster.num_nodes=2 .*gpus_per_actor=0.5 .*"
                                         r"two nodes' groups"):
        check_gpu_layout(_cluster(1, 1, 0.5, nodes=2), EVAL_OFF, [2, 2])


def test_whole_bundles_keep_drafters_apart_however_ray_places_them():
    check_gpu_layout(_cluster(1, 3, 0.51, nodes=2), EVAL_OFF, [8, 8])


@pytest.mark.parametrize("resources,requested,device", [
    ([{"CPU": 8}], "auto", "cpu"),
    ([{"CPU": 8}, {"CPU": 64, "GPU": 8}], "auto", "cuda"),  # CPU head, GPU worker
    ([{"CPU": 8, "GPU": 1}], "cpu", "cpu"),                 # explicit choices are kept
    ([{"CPU": 8, "GPU": 1}], "cuda", "cuda"),
])
def test_the_device_is_decided_from_the_cluster_nodes(resources, requested, device):
    assert cluster_device(requested, resources) == device


def test_cuda_on_a_cluster_without_gpus_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"cluster.device='cuda'.*2 live node\(s\) has a GPU.*"
                                         r"'cpu' or 'auto'"):
        cluster_device("cuda", [{"CPU": 4}, {"CPU": 4, "GPU": 0}])


@pytest.fixture()
def cpu_ray(ray_cluster):
    if ray.cluster_resources().get("GPU", 0) > 0:
        pytest.skip("the suite's local Ray has GPUs")


def test_a_local_ray_without_gpus_resolves_auto_to_cpu(cpu_ray):
    assert check_cluster(ClusterConfig(device="auto"), EVAL_ON) == "cpu"


class _Started(Exception):
    """Raised in place of starting the actors, carrying what they would have been given."""


def test_a_driver_on_a_gpu_host_trains_on_the_cpu_cluster(cpu_ray, tiny_assets, tmp_path,
                                                          monkeypatch):
    monkeypatch.setattr("pipeline.job.resolve.resolve_device", lambda requested: "cuda")
    driver = Driver(compose_job(["cluster.device=auto", f"train.out_dir={tmp_path}"]))
    assert driver.r.device == "cuda"  # this host's guess, before Ray

    def started(job, r, dataset, resume, checkpoint):
        raise _Started(r)
    monkeypatch.setattr(job_module, "ActorGroup", started)
    with pytest.raises(_Started) as got:
        driver.run()
    r = got.value.args[0]
    assert r.device == "cpu" and str(r.target_dtype) == "torch.float32"
    assert r.autocast_dtype is None


def test_cuda_on_the_cpu_cluster_stops_before_any_actor(cpu_ray, tiny_assets, tmp_path):
    with pytest.raises(ValueError, match=r"cluster.device='cuda' is not allowed"):
        Driver(compose_job(["cluster.device=cuda", f"train.out_dir={tmp_path}"])).run()
