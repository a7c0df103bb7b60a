"""Host copies of the trainer state for a background save: the only part of a save that holds
the step loop.

A synchronous save of the Qwen3-8B drafter (12.6 GB of fp32 weights and AdamW moments) held
the step loop for ~39 s. A save now only copies the state into host buffers (pinned on CUDA,
so the copy runs at PCIe speed) and returns; pipeline/checkpoint/writer.py writes the copy in
the background. The buffers are allocated in the background at construction and reused by
every save. Pinning 12.6 GB takes seconds, through the host-register allocator actors start
with so that GPU work goes on beside it (pipeline/runtime/ray_start.py); a drafter about to load a
checkpoint allocates them after the load instead of beside it. Under drafter.parallel=fsdp each
rank copies only its own shards (DTensors keep their placement: the copy is a DTensor over host
memory).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Callable, Optional

import torch

Spec = tuple[tuple[int, ...], torch.dtype]


class HostPool:
    """Host tensors that snapshots copy into, reused from one save to the next.

    One tensor per state tensor (a writer may serialise each storage whole, so views into one
    big arena could write the arena). Those given as ``expected`` are allocated in a
    background thread by :meth:`fill` (at once unless ``fill=False``), less those the pool
    was given meanwhile (:meth:`release`: a checkpoint read ahead leaves its host tensors
    here); a shape the pool lacks is allocated when first needed.
    """

    def __init__(self, expected: list[Spec], pin: bool, fill: bool = True) -> None:
        self.pin = pin
        self._expected = list(expected)
        self._free: dict[Spec, list[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        if fill:
            self.fill()

    def fill(self) -> None:
        """Allocate, in a background thread, the expected tensors the pool does not hold
        (once: later calls do nothing)."""
        if self._thread is not None:
            return
        with self._lock:
            held = Counter({spec: len(ts) for spec, ts in self._free.items()})
        lacking = []
        for shape, dtype in self._expected:
            if held[(tuple(shape), dtype)] > 0:
                held[(tuple(shape), dtype)] -= 1
            else:
                lacking.append((shape, dtype))
        self._thread = threading.Thread(target=self._allocate, args=(lacking,),
                                        name="host-pool-alloc", daemon=True)
        self._thread.start()

    def _allocate(self, specs: list[Spec]) -> None:
        for shape, dtype in specs:
            self.release([self._new(shape, dtype)])

    def _new(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=self.pin)

    def acquire(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            free = self._free.get((tuple(shape), dtype))
            if free:
                return free.pop()
        return self._new(tuple(shape), dtype)

    def release(self, tensors: list[torch.Tensor]) -> None:
        with self._lock:
            for t in tensors:
                self._free.setdefault((tuple(t.shape), t.dtype), []).append(t)


def snapshot(state: Any, pool: HostPool) -> tuple[Any, list[torch.Tensor]]:
    """``state`` with every tensor replaced by a host copy (containers rebuilt, so later
    changes to the live state never reach the snapshot), and the pool tensors it holds."""
    from torch.distributed.tensor import DTensor  # only drafters snapshot (see writer.py)

    taken: list[torch.Tensor] = []
    on_cuda = False

    def host_copy(t: torch.Tensor) -> torch.Tensor:
        nonlocal on_cuda
        local = t._local_tensor if isinstance(t, DTensor) else t
        out = pool.acquire(tuple(local.shape), local.dtype)
        taken.append(out)
        on_cuda |= local.is_cuda
        out.copy_(local.detach(), non_blocking=local.is_cuda)
        # A shard stays a shard: the same placement over the same ranks, its data on the host.
        return DTensor(out, t._spec, requires_grad=False) if isinstance(t, DTensor) else out

    out = map_tensors(state, host_copy)
    if on_cuda:
        torch.cuda.synchronize()
    return out, taken


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` rebuilt with ``fn`` applied to every tensor in it (dicts, lists, tuples)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    return obj
