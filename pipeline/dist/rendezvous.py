"""The one way actors form a torch.distributed process group.

Rank 0 picks its node's IP and a free port; the driver tells every rank that address together
with its rank and the world size; every rank then joins:

    master = ray.get(rank0.pick_master.remote())             # runs pick_master() on rank 0's node
    ray.get([w.init_group.remote(r, n, master.addr, master.port, backend_for(device))
             for r, w in enumerate(workers)])

``pick_master`` must run inside rank 0's process: the port has to be free on *its* node, and
rank 0 is the one that listens on it (the TCP store). The port is released between picking and
listening, so another process could take it first; that race is rare and fails loudly at join.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import ray
import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

_BACKENDS = {"cuda": "nccl", "cpu": "gloo"}


@dataclass(frozen=True)
class MasterAddress:
    """Where rank 0 listens; sent from rank 0 to the driver and on to every rank."""

    addr: str
    port: int


def node_ip() -> str:
    """This node's IP as Ray sees it, or loopback outside Ray (a single-process run)."""
    if ray.is_initialized():
        return ray.util.get_node_ip_address()
    return "127.0.0.1"


def pick_master() -> MasterAddress:
    """This node's IP and a port that is free on it right now; call it in rank 0's process."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return MasterAddress(addr=node_ip(), port=port)


def backend_for(device: torch.device | str) -> str:
    """The collective backend for a device kind: NCCL between GPUs, gloo between CPU processes."""
    kind = torch.device(device).type
    if kind not in _BACKENDS:
        raise ValueError(f"device={device!s} has no process-group backend: "
                         f"expected one of {sorted(_BACKENDS)}")
    return _BACKENDS[kind]


def init_group(rank: int, world_size: int, addr: str, port: int, backend: str,
               timeout_s: float = 600.0) -> None:
    """Join the default process group of ``world_size`` ranks whose rank 0 listens at addr:port.

    The standard variables are exported too, so code that reads them (torch.distributed
    helpers, logging) sees the same values this group was formed with.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not allowed: "
                         f"expected 0 <= rank < world_size={world_size}")
    if backend not in _BACKENDS.values():
        raise ValueError(f"backend={backend!r} is not allowed: "
                         f"expected one of {sorted(_BACKENDS.values())}")
    if dist.is_initialized():
        raise ValueError("init_group: this process is already in a process group; "
                         "call destroy_group first")
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    host = f"[{addr}]" if ":" in addr else addr  # IPv6 literals need brackets in a URL.
    dist.init_process_group(backend=backend, init_method=f"tcp://{host}:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout_s))
    logger.info("joined %s group as rank %d of %d (master %s:%d)", backend, rank, world_size,
                addr, port)


def destroy_group() -> None:
    """Leave the default process group; a no-op when this process is in none."""
    if dist.is_initialized():
        dist.destroy_process_group()
