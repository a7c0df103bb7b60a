"""The generator actors: Ray start-up, placement by resource, and in-order dispatch.

``ray.remote`` is applied here to the plain :class:`GeneratorWorker`. Generators need no
placement groups or rendezvous (they never talk to each other), so each simply asks Ray for
one GPU on cuda and lands wherever one is free.
"""

from __future__ import annotations

import collections
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import ray
import torch

from pipeline.regen.config import RegenConfig
from pipeline.regen.messages import GenRequest, GenResult
from pipeline.workers.generator import GeneratorWorker

log = logging.getLogger(__name__)

# The folder holding the ``pipeline`` package. Derived from this file, not from
# ``pipeline.__file__``: under the ``pytest`` script ``tests/`` comes first on sys.path and
# ``pipeline`` is then the namespace package ``tests/pipeline`` (its __file__ is None).
_ROOT = str(Path(__file__).resolve().parents[2])

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def init_ray(cfg: RegenConfig) -> bool:
    """Connect to Ray (given address, ``$RAY_ADDRESS``, or a private local cluster).

    Returns True when this call started Ray, so the caller knows it should shut it down.
    """
    if ray.is_initialized():
        return False
    address = cfg.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
        return True
    # Logical CPUs enough for every actor, even on a 2-core laptop.
    need = math.ceil(cfg.num_workers * cfg.cpus_per_worker) + 1
    ray.init(num_cpus=max(os.cpu_count() or 1, need), include_dashboard=False)
    return True


def pick_device(cfg: RegenConfig) -> str:
    """``--device`` made concrete, checked against the GPUs the Ray cluster has."""
    gpus = int(ray.cluster_resources().get("GPU", 0))
    device = cfg.device if cfg.device != "auto" else ("cuda" if gpus else "cpu")
    if device == "cuda" and gpus < cfg.num_workers:
        raise ValueError(f"--device=cuda with --num-workers={cfg.num_workers} needs one GPU "
                         f"per worker, but the Ray cluster has {gpus}: allowed 1..{gpus} "
                         f"workers, or --device=cpu")
    return device


def pick_dtype(cfg: RegenConfig, device: str) -> torch.dtype:
    if cfg.dtype == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return _DTYPES[cfg.dtype]


def _actor_env() -> dict[str, str]:
    """Our package on the actors' path, wherever Ray starts them with a fresh environment.

    Generators never talk to each other, so the NCCL settings the training actors get
    (pipeline.launcher.actor_env) do not matter here.
    """
    path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


def start_generators(cfg: RegenConfig, target_path: str, device: str,
                     dtype: torch.dtype) -> list[Any]:
    """``cfg.num_workers`` plain actors (methods on their main thread), one GPU each on cuda."""
    options: dict[str, Any] = {"num_cpus": cfg.cpus_per_worker,
                               "runtime_env": {"env_vars": _actor_env()}}
    if device == "cuda":
        options["num_gpus"] = 1
    actor = ray.remote(GeneratorWorker).options(**options)
    return [actor.remote(rank, target_path, device, dtype, cfg.max_new_tokens)
            for rank in range(cfg.num_workers)]


def stop_generators(workers: Sequence[Any]) -> None:
    for handle in workers:
        ray.kill(handle)


def ordered_results(workers: Sequence[Any], batches: Iterator[list[GenRequest]],
                    per_worker: int) -> Iterator[list[GenResult]]:
    """Each batch's results, in the order the batches came, while workers stay busy.

    Every worker holds up to ``per_worker`` batches; a worker gets its next batch as soon as
    one of its own finishes, so faster workers take more. Results that finish ahead of an
    earlier, slower batch wait in a buffer, which is bounded: submission pauses once twice
    the in-flight budget is outstanding, so one stuck batch cannot make memory grow.
    """
    slots = collections.deque(w for w in range(len(workers)) for _ in range(per_worker))
    window = 2 * len(slots)
    pending: dict[Any, tuple[int, int]] = {}  # ref -> (batch number, worker)
    finished: dict[int, list[GenResult]] = {}
    submitted = emitted = 0
    exhausted = False
    while True:
        while slots and not exhausted and submitted - emitted < window:
            batch: Optional[list[GenRequest]] = next(batches, None)
            if batch is None:
                exhausted = True
                break
            worker = slots.popleft()
            pending[workers[worker].generate.remote(batch)] = (submitted, worker)
            submitted += 1
        if not pending:
            break
        [ref], _ = ray.wait(list(pending), num_returns=1)
        number, worker = pending.pop(ref)
        finished[number] = ray.get(ref)  # a worker's exception surfaces here
        slots.append(worker)
        while emitted in finished:
            yield finished.pop(emitted)
            emitted += 1
    assert not finished, f"batches {sorted(finished)} finished but were never emitted"
