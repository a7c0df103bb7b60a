"""The rendezvous helper: two Ray actors form a gloo group and all-reduce correctly."""

import os

import pytest
import ray
import torch
import torch.distributed as dist

from pipeline.dist.rendezvous import (MasterAddress, backend_for, destroy_group, init_group,
                                      pick_master)


class GroupMember:
    """A plain worker that joins a process group through the helper, as real workers do."""

    def pick_master(self) -> MasterAddress:
        return pick_master()

    def join(self, rank: int, world_size: int, addr: str, port: int) -> dict[str, str]:
        init_group(rank, world_size, addr, port, backend_for("cpu"), timeout_s=60)
        return {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}

    def all_reduce(self, values: list[float]) -> list[float]:
        t = torch.tensor(values)
        dist.all_reduce(t)
        return t.tolist()

    def leave(self) -> bool:
        destroy_group()
        return dist.is_initialized()


def test_two_actors_all_reduce_over_gloo(ray_session):
    members = [ray.remote(GroupMember).remote() for _ in range(2)]
    try:
        master = ray.get(members[0].pick_master.remote())
        assert master.addr == ray.util.get_node_ip_address() and master.port > 0
        envs = ray.get([m.join.remote(r, 2, master.addr, master.port)
                        for r, m in enumerate(members)])
        assert [e["RANK"] for e in envs] == ["0", "1"]
        assert {(e["MASTER_ADDR"], e["MASTER_PORT"], e["WORLD_SIZE"]) for e in envs} == {
            (master.addr, str(master.port), "2")}
        sums = ray.get([m.all_reduce.remote([1.0 + r, 10.0 * r]) for r, m in enumerate(members)])
        assert sums == [[3.0, 10.0], [3.0, 10.0]]
        assert ray.get([m.leave.remote() for m in members]) == [False, False]
    finally:
        for m in members:
            ray.kill(m)


def test_backend_follows_the_device():
    assert backend_for("cpu") == "gloo"
    assert backend_for(torch.device("cuda", 1)) == "nccl"
    with pytest.raises(ValueError, match="device=meta"):
        backend_for("meta")


@pytest.mark.parametrize("rank, world_size, backend, message", [
    (2, 2, "gloo", "rank=2"),
    (-1, 2, "gloo", "rank=-1"),
    (0, 1, "mpi", "backend='mpi'"),
])
def test_bad_arguments_are_value_errors(rank, world_size, backend, message):
    with pytest.raises(ValueError, match=message):
        init_group(rank, world_size, "127.0.0.1", 1, backend)


def test_destroy_without_a_group_is_a_no_op():
    destroy_group()
    assert not dist.is_initialized()
