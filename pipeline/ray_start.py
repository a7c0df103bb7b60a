"""Ray start-up: join or start a cluster, and the environment every actor must see.

The driver and regeneration both start here, so it sits below both.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

import ray

# Environment every actor must see: our package on the path, and the GPU machine's NCCL
# safety settings (NVLink multicast off) also where Ray starts workers with a fresh env.
_PASS_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
             "NCCL_DEBUG", "WANDB_MODE")


def actor_env() -> dict[str, str]:
    # This file's location, not pipeline.__file__: a namespace package named "pipeline" (e.g.
    # tests/pipeline under plain `pytest`) has no __file__.
    root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path}
    env.update({k: os.environ[k] for k in _PASS_ENV if k in os.environ})
    return env


def init_ray(address: Optional[str], cpus_needed: float) -> bool:
    """Join ``address`` (or $RAY_ADDRESS), else start a private local cluster.

    A local cluster gets logical CPUs enough for every actor, even on a 2-core laptop.
    Returns True when this call initialised Ray (the caller may shut it down).
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
    else:
        ray.init(num_cpus=max(os.cpu_count() or 1, math.ceil(cpus_needed)),
                 include_dashboard=False)
    return True
