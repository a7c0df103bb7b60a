"""The generator actors: Ray start-up, placement by resource, and in-order dispatch.

Generators need no placement groups or rendezvous (they never talk to each other), so each
simply asks Ray for one GPU on cuda and lands wherever one is free. They start through
:func:`pipeline.runtime.ray_start.start_actor`, like the training actors.
"""

from __future__ import annotations

import collections
import logging
from typing import Any, ContextManager, Iterator, Optional, Sequence

import ray
import torch

from pipeline.runtime import stop_signals
from pipeline.runtime.ray_start import Placement, kill_actors, start_actor
from pipeline.checks.dtypes import resolve_dtype
from pipeline.regen.config import RegenConfig
from pipeline.regen.generator import GeneratorWorker
from pipeline.regen.messages import GenRequest, GenResult

log = logging.getLogger(__name__)


def ray_session(cfg: RegenConfig) -> ContextManager[None]:
    """Ray while the generators run; shut down after only if this job started it. Through
    stop_signals: ray.init takes SIGTERM over, and the entry point's handler comes back."""
    return stop_signals.ray_session(cfg.ray_address, cfg.num_workers * cfg.cpus_per_worker + 1)


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
    return resolve_dtype(cfg.dtype, device)


def start_generators(cfg: RegenConfig, target_path: str, device: str,
                     dtype: torch.dtype, lines: Optional[int] = None) -> list[Any]:
    """``cfg.num_workers`` plain actors (methods on their main thread), one GPU each on cuda.
    ``lines``: the conversations left to answer (None: unknown), from which each worker's
    share of the answers is bounded for its auto compile choice."""
    answer_tokens = (None if lines is None else
                     -(-lines // cfg.num_workers) * cfg.max_new_tokens)
    placement = Placement(cpus=cfg.cpus_per_worker, gpus=1.0 if device == "cuda" else 0.0)
    return [start_actor(GeneratorWorker, placement, rank=rank, target_path=target_path,
                        device=device, dtype=dtype, max_new_tokens=cfg.max_new_tokens,
                        enable_thinking=cfg.enable_thinking, engine=cfg.engine,
                        cb_options=cfg.cb_options(), static_rows=cfg.static_rows,
                        static_attention=cfg.static_attention,
                        static_compile=cfg.static_compile,
                        static_compile_prefill=cfg.static_compile_prefill,
                        answer_tokens=answer_tokens)
            for rank in range(cfg.num_workers)]


def describe_generators(workers: Sequence[Any]) -> list[str]:
    """Each generator's line (GeneratorWorker.describe), once all are built."""
    return ray.get([w.describe.remote() for w in workers])


def engine_counts(workers: Sequence[Any]) -> list[dict]:
    """Each generator's engine counts (GeneratorWorker.engine_counts), in rank order."""
    return ray.get([w.engine_counts.remote() for w in workers])


def stop_generators(workers: Sequence[Any]) -> None:
    kill_actors(list(workers))


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
