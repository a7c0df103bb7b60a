"""A staged target against the whole one: random Qwen3-8B-shape weights, 2 stages on one GPU.

Through the workers directly, as Ray actors (not the whole pipeline: no drafter, so the rate
is the target's alone): the whole target is one ``TargetWorker`` actor; the staged one is
``target.stages`` ``TargetStageWorker`` actors sharing the GPU (fractional ``num_gpus``),
activations crossing between their processes over CUDA IPC. Micro-batches are chained
exactly as the driver chains them (``pipeline.driver.staged.produce_chain``: each stage's call
takes the previous call's ref, ``num_slots`` micro-batches in flight), and a slot is reused
once its last stage published it (no drafter reads it here).

    from bench.scale.stages import run_stages
    run_stages(Path("/tmp/bench"))   # on the H200; builds the random target once

Returns ``whole_target_samples_per_s``, ``staged_target_samples_per_s`` and
``staged_taps_max_abs_diff`` (the staged taps against the whole target's on one micro-batch,
read back over CUDA IPC by a reader actor; both bf16).
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

import ray
import torch

from bench.scale.synthetic import build_target
from pipeline.model.config import qwen3_8b_config
from pipeline.driver.staged import connect_stages, produce_chain, start_stages
from pipeline.runtime.ray_start import Placement, init_ray, kill_actors, start_actor
from pipeline.transport.messages import RingHandle, SlotReady
from pipeline.transport.ring import RingReader
from pipeline.workers.common import actor_device
from pipeline.workers.messages import MicroBatch, MicroBatchMeta
from pipeline.workers.target_worker import TargetWorker

TAPS = (1, 9, 17, 25, 33)  # the Qwen3-8B recipe's taps (dflash.md)


def _batch(index: int, rows: int, length: int, vocab: int) -> MicroBatch:
    g = torch.Generator().manual_seed(index)
    ids = torch.randint(0, vocab, (rows, length), generator=g)
    meta = MicroBatchMeta(step=0, epoch=0, index=index, num_in_step=1,
                          sample_ids=tuple(range(index * rows, (index + 1) * rows)),
                          shape=(rows, length))
    return MicroBatch(meta, ids, torch.ones_like(ids))


def _rate(chain: list[Any], batches: list[Any], rows: int, num_slots: int, warmup: int) -> float:
    """Samples/s of ``chain`` over ``batches`` (refs), ``num_slots`` micro-batches in flight."""
    in_flight: deque = deque()
    t0 = None
    for i, batch in enumerate(batches):
        if i == warmup:
            ray.get(list(in_flight))
            in_flight.clear()
            t0 = time.perf_counter()
        if len(in_flight) == num_slots:
            ray.get(in_flight.popleft())
        in_flight.append(produce_chain(chain, i % num_slots, batch))
    ray.get(list(in_flight))
    assert t0 is not None, "warmup must be shorter than the run"
    return (len(batches) - warmup) * rows / (time.perf_counter() - t0)


class TapReader:
    """Reads tap slots in an actor of its own, as a drafter would, and hands back CPU copies.

    Not in the calling process: on CPU, mapping an actor's shared-memory segment registers with
    that actor's torch shm manager, which Ray kills with the actor; the caller's later rings
    then fail ("Broken pipe").
    """

    def __init__(self, device: str) -> None:
        self.reader = RingReader(actor_device(device))

    def attach(self, handle: RingHandle) -> None:
        self.reader.attach(handle)

    def read(self, ready: SlotReady) -> torch.Tensor:
        got = self.reader.view(ready).cpu()  # a copy, finished before the ack below
        self.reader.release_view(ready)
        return got

    def close(self) -> None:
        self.reader.close()


def start_reader(device: str) -> Any:
    return start_actor(TapReader, Placement(cpus=0.5, gpus=0.05 if device == "cuda" else 0.0),
                       device=device)


def _taps(chain: list[Any], batch: Any, device: str) -> torch.Tensor:
    """One micro-batch's taps from slot 0 of ``chain``'s tap ring, read by a TapReader."""
    ready = produce_chain(chain, 0, batch)
    reader = start_reader(device)
    try:
        ray.get(reader.attach.remote(chain[-1].ring_handle.remote()))
        return ray.get(reader.read.remote(ready))
    finally:
        ray.get(reader.close.remote())
        kill_actors([reader])


def _measure(start: Callable[[], list[Any]], batches: list[Any], rows: int, num_slots: int,
             warmup: int, device: str) -> tuple[float, torch.Tensor]:
    chain = start()
    try:
        connect_stages([chain])
        rate = _rate(chain, batches, rows, num_slots, warmup)
        return rate, _taps(chain, batches[0], device)
    finally:
        ray.get([h.close.remote() for h in chain])
        kill_actors(chain)


def run_stages(work: Path, stages: int = 2, rows: int = 4, length: int = 800,
               micro_batches: int = 40, warmup: int = 8, num_slots: int = 4,
               compile: bool = False, device: str = "cuda", config: dict | None = None,
               taps: tuple[int, ...] = TAPS) -> dict:
    """``config``: another Qwen3 shape than 8B's (a small one checks the wiring on CPU)."""
    hf = config or qwen3_8b_config()
    path = build_target(work / ("qwen3-8b-random" if config is None else "qwen3-small-random"),
                        config)
    vocab, hidden = hf["vocab_size"], hf["hidden_size"]
    slot_numel = rows * length * len(taps) * hidden
    args = dict(rank=0, target_path=str(path), tap_ids=taps, device=device,
                dtype=torch.bfloat16, num_slots=num_slots, slot_numel=slot_numel,
                compile=compile)
    gpu = 1.0 if device == "cuda" else 0.0
    started = init_ray(None, cpus_needed=stages + 2)
    try:
        batches = [ray.put(_batch(i, rows, length, vocab)) for i in range(micro_batches)]
        share = 0.9 / stages  # the stages share one GPU (and the tap reader takes 0.05)
        whole_rate, whole_taps = _measure(
            lambda: [start_actor(TargetWorker, Placement(cpus=1, gpus=0.9 * gpu), **args)],
            batches, rows, num_slots, warmup, device)
        staged_rate, staged_taps = _measure(
            lambda: start_stages(lambda s: Placement(cpus=1, gpus=share * gpu), stages,
                                 act_numel=rows * length * hidden, **args),
            batches, rows, num_slots, warmup, device)
    finally:
        if started:
            ray.shutdown()
    diff = (staged_taps.float() - whole_taps.float()).abs().max().item()
    return {"stages": stages, "rows": rows, "length": length, "compile": compile,
            "whole_target_samples_per_s": whole_rate,
            "staged_target_samples_per_s": staged_rate,
            "staged_taps_max_abs_diff": diff,
            "taps_abs_max": whole_taps.float().abs().max().item(),
            "taps_shape": list(whole_taps.shape)}
