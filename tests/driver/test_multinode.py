"""A simulated two-node Ray cluster (``ray.cluster_utils.Cluster``: two raylets on this machine,
each with its own logical CPUs and node id).

Each node's targets feed only that node's drafters and drafter ranks are node-contiguous; a
ring handed to a reader (or a real drafter) on the other node is refused, although on one
machine its memory could be opened; and ``placement_strategy=PACK``, which may split a node's
group, is refused before any actor starts.
"""

from __future__ import annotations

import pytest
import ray
import torch
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pipeline.driver.actors import ActorGroup
from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver
from pipeline.driver.scheduler import StepLoop, StepReport
from pipeline.job.job_data import load_job_data
from pipeline.runtime.actor_pool import drop_kept_actors
from pipeline.runtime.ray_start import init_local
from pipeline.job.resolve import resolve_job
from pipeline.transport.node import current_node_id
from pipeline.transport.ring import RingReader, SlotRing

# 3 logical CPUs a node: the prefetcher (1) and one group (a target and a drafter, 1 each) fit
# on one node, two groups never do, so the groups land on different nodes. One drafter a node
# keeps the test fast (every actor is a process that imports torch).
CPUS_PER_NODE = 3


@pytest.fixture(scope="module")
def two_nodes(request, tiny_assets, ray_init_args):
    restore = ray.is_initialized()
    if restore:  # the session's single-node Ray; brought back afterwards
        ray.shutdown()
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": CPUS_PER_NODE, "include_dashboard": False})
    cluster.add_node(num_cpus=CPUS_PER_NODE)
    ray.init(address=cluster.address, logging_level="WARNING")
    ray.cloudpickle.register_pickle_by_value(request.module)
    try:
        yield cluster
    finally:
        ray.cloudpickle.unregister_pickle_by_value(request.module)
        ray.shutdown()
        cluster.shutdown()
        if restore:
            init_local(**ray_init_args)


@pytest.fixture(autouse=True)
def no_kept_actors():
    """Each test here finds its nodes' 3 CPUs free: no actor kept from the test before."""
    drop_kept_actors()
    yield


def _job(cluster, tmp_path, train_file, *extra):
    return compose_job(["cluster.device=cpu", "cluster.num_nodes=2",
                        "cluster.targets_per_node=1", "cluster.drafters_per_node=1",
                        "cluster.cpus_per_actor=1", f"cluster.address={cluster.address}",
                        f"data.train_path={train_file}", "train.plan.max_steps=2",
                        "train.eval.every=-1", f"train.out_dir={tmp_path}", *extra])


def _node_of(actor) -> str:
    return ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))


@pytest.mark.slow
def test_each_node_feeds_its_own_drafters(two_nodes, small_train_file, tmp_path):
    job = _job(two_nodes, tmp_path, small_train_file)
    reports: list[StepReport] = []
    resolved = resolve_job(job)
    dataset = load_job_data(job, resolved, heldout=False).train
    with ActorGroup(job, resolved, dataset) as actors:
        target_nodes = [_node_of(t) for t in actors.targets]
        drafter_nodes = [_node_of(d) for d in actors.drafters]
        # Two real nodes, ranks node-contiguous (sorted by node id), bookkeeping = reality.
        assert len(set(target_nodes)) == 2 and target_nodes == sorted(target_nodes)
        assert drafter_nodes == sorted(drafter_nodes) == target_nodes
        assert actors.target_node == [0, 1] and actors.drafter_node == [0, 1]

        StepLoop(actors.topology(), 2, on_step=reports.append).run()

        # A real drafter refuses the other node's ring (rings are refused, not just unused).
        other = ray.get(actors.targets[1].ring_handle.remote())
        with pytest.raises(ValueError, match="cannot be opened across nodes"):
            ray.get(actors.drafters[0].attach.remote([other]))

    fed = set()
    for report in reports:
        target_of = {ready.sample_ids: ready.target_rank for ready in report.produced}
        for micro in report.micro:
            target = target_of[micro.sample_ids]
            assert target_nodes[target] == drafter_nodes[micro.drafter], (
                f"target {target} fed drafter {micro.drafter} on another node")
            fed.add((target, micro.drafter))
    assert fed == {(0, 0), (1, 1)}, "each node's target should have fed its drafter"


class RingOwner:
    def __init__(self) -> None:
        self.ring = SlotRing(0, 2, 8, torch.float32, "cpu")  # node id: where it runs

    def handle(self):
        return self.ring.handle()

    def close(self) -> None:
        self.ring.close()


class Reader:
    def __init__(self) -> None:
        self.reader = RingReader("cpu", node_id=current_node_id())

    def attach(self, handle) -> str:
        self.reader.attach(handle)
        return "attached"

    def close(self) -> None:
        self.reader.close()


@pytest.mark.slow
def test_a_ring_from_another_node_is_refused(two_nodes):
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    on = [NodeAffinitySchedulingStrategy(n, soft=False) for n in nodes]
    owner = ray.remote(RingOwner).options(num_cpus=0.1, scheduling_strategy=on[1]).remote()
    near = ray.remote(Reader).options(num_cpus=0.1, scheduling_strategy=on[1]).remote()
    far = ray.remote(Reader).options(num_cpus=0.1, scheduling_strategy=on[0]).remote()
    try:
        handle = ray.get(owner.handle.remote())
        assert handle.node_id == nodes[1]
        assert ray.get(near.attach.remote(handle)) == "attached"
        with pytest.raises(ValueError, match=f"lives on node {nodes[1]}.*runs on node "
                                             f"{nodes[0]}.*cannot be opened across nodes"):
            ray.get(far.attach.remote(handle))
    finally:
        ray.get([near.close.remote(), far.close.remote()])
        ray.get(owner.close.remote())
        for actor in (owner, near, far):
            ray.kill(actor)


def test_pack_on_two_nodes_is_refused_before_any_actor_starts(two_nodes, small_train_file,
                                                              tmp_path):
    from ray._private.state import actors as actor_table
    from ray.util import placement_group_table

    job = _job(two_nodes, tmp_path, small_train_file, "cluster.placement_strategy=PACK")
    driver = Driver(job)
    actors_before, groups_before = len(actor_table()), len(placement_group_table())
    with pytest.raises(ValueError, match=r"cluster.placement_strategy='PACK' may split a "
                                         r"node's group of 2 actors across the 2 nodes.*"
                                         r"allowed on a multi-node cluster: 'STRICT_PACK'"):
        driver.run()
    assert len(actor_table()) == actors_before, "an actor was started"
    assert len(placement_group_table()) == groups_before, "a placement group was created"
