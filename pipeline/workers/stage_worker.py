"""A target stage worker: one slice of a staged target's layers (``target.stages=k``).

Per micro-batch the driver chains one ``produce`` call per stage, each taking the previous
call's ref (Ray resolves it before the call runs, and the driver never waits), so stage 0
works on micro-batch i+1 while stage 1 works on i. All stages use the tap slot the driver gave
the target:

* stage 0 embeds the token ids; stage s > 0 reads stage s-1's output, zero-copy, from the
  activation ring stage s-1 owns (slot index = the tap slot index);
* each stage writes the columns of the taps it holds into the tap slot: the last stage owns
  the tap ring and publishes it, the others write through a ``SlotWriter`` opened once;
* every stage but the last writes its output into its own activation ring and publishes it.

Why reusing the tap slot's index for the activation slot is safe: the driver hands tap slot j
out again only after a drafter acked it, which is after the last stage published it, which
is after every stage finished reading its input for it (each call synchronises the device
before its message exists).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from pipeline.model.stages import load_target_stage
from pipeline.transport.messages import ProduceMeta, RingHandle, SlotReady
from pipeline.transport.ring import RingReader, SlotRing
from pipeline.transport.shared import release_manager_folder
from pipeline.transport.writer import SlotWriter
from pipeline.workers.common import actor_device, on_main_thread
from pipeline.workers.messages import MicroBatch


@dataclass(frozen=True)
class StageOut:
    """Stage s's message to stage s+1: its output's slot, and the chain's timing so far."""

    act: SlotReady
    start_s: float  # wall clock when stage 0 began this micro-batch
    busy_s: tuple[float, ...]  # each stage's busy seconds so far
    on_main_thread: bool


class TargetStageWorker:
    def __init__(self, *, rank: int, stage: int, num_stages: int, target_path: str,
                 tap_ids: Sequence[int], device: str, dtype: torch.dtype, num_slots: int,
                 slot_numel: int, act_numel: int, node_id: Optional[str] = None,
                 compile: bool = False) -> None:
        self.rank = rank
        self.device = actor_device(device)
        self.node_id = node_id
        self.stage = load_target_stage(target_path, tap_ids, stage, num_stages, self.device,
                                       dtype, compile=compile)
        self.plan = plan = self.stage.plan
        # The tap ring the drafters read ([micro_batch, length, n_taps * H]): the last stage's.
        self.ring = SlotRing(rank, num_slots, slot_numel, dtype, self.device,
                             node_id) if plan.last else None
        # This stage's output for the next one ([micro_batch, length, H]).
        self.act_ring = None if plan.last else SlotRing(rank, num_slots, act_numel, dtype,
                                                        self.device, node_id)
        self.reader = None if plan.first else RingReader(self.device, node_id)
        self.taps: Optional[SlotWriter] = None

    def ring_handle(self) -> RingHandle:
        """The tap ring's handle (the last stage owns it)."""
        assert self.ring is not None, f"stage {self.plan.stage} holds no tap ring"
        return self.ring.handle()

    def act_handle(self) -> RingHandle:
        assert self.act_ring is not None, "the last stage has no activation ring"
        return self.act_ring.handle()

    def connect(self, upstream: Optional[RingHandle], taps: RingHandle) -> None:
        """Open the previous stage's activation ring and (not the last stage) the tap ring.

        Once per ring: a second call with the same rings (the drafters alone were restarted,
        and rendezvous runs again) opens nothing.
        """
        if self.reader is not None:
            assert upstream is not None, f"stage {self.plan.stage} needs its upstream ring"
            self.reader.attach(upstream)  # a no-op for the ring already attached
        if self.ring is None and (self.taps is None or
                                  self.taps.handle.ring_id != taps.ring_id):
            self.taps = SlotWriter(taps, self.device, self.node_id)

    def produce(self, slot: int, batch: MicroBatch,
                upstream: Optional[StageOut] = None) -> StageOut | SlotReady:
        """Run this stage on ``batch``; a StageOut for the next stage, or (last) the SlotReady."""
        start, t0 = time.time(), time.perf_counter()
        plan = self.plan
        if plan.first:
            inputs = batch.input_ids.to(self.device)
        else:
            assert upstream is not None and self.reader is not None
            inputs = self.reader.view(upstream.act)
        hidden, taps = self.stage(inputs)
        n, length, width = *hidden.shape[:2], hidden.shape[-1]
        shape = (n, length, len(plan.tap_ids) * width)
        out = self.ring.slot(slot, shape) if self.ring is not None else self.taps.slot(slot, shape)
        for column, layer in plan.columns():
            out[..., column * width:(column + 1) * width].copy_(taps[layer])
        sample_ids = batch.meta.sample_ids
        if self.ring is not None:  # last stage: every stage's columns are in; announce them
            ready = self.ring.publish(slot, shape, sample_ids)  # synchronised
            busy = (*(upstream.busy_s if upstream else ()), time.perf_counter() - t0)
            meta = ProduceMeta(step=batch.meta.step, index=batch.meta.index,
                               start_s=upstream.start_s if upstream else start,
                               # the slowest stage bounds the chain's rate
                               busy_s=max(busy), on_main_thread=on_main_thread() and (
                                   upstream is None or upstream.on_main_thread))
            return SlotReady(ready.target_rank, ready.slot, ready.shape, ready.sample_ids, meta)
        assert self.act_ring is not None and self.taps is not None
        self.act_ring.slot(slot, hidden.shape).copy_(hidden)
        self.taps.finish()
        act = self.act_ring.publish(slot, hidden.shape, sample_ids)  # synchronised
        return StageOut(act=act, start_s=upstream.start_s if upstream else start,
                        busy_s=(*(upstream.busy_s if upstream else ()),
                                time.perf_counter() - t0),
                        on_main_thread=on_main_thread() and (
                            upstream is None or upstream.on_main_thread))

    def close(self) -> None:
        """Unmap what this stage opened, then free its own rings."""
        for part in (self.reader, self.taps, self.act_ring, self.ring):
            if part is not None:
                part.close()
        release_manager_folder()  # the actor's last act: Ray kills its shm manager with it
