"""A target worker: the frozen target on one device, writing tap features into its slot ring
(and, for a distilling drafter, the target's final normed hidden state after them)."""

from __future__ import annotations

import dataclasses
import time
from typing import Optional, Sequence

import torch

from pipeline.model.target import load_target
from pipeline.transport.messages import ProduceMeta, RingHandle, SlotReady
from pipeline.transport.ring import SlotRing
from pipeline.transport.shared import release_manager_folder
from pipeline.workers.common import actor_device, on_main_thread
from pipeline.workers.messages import MicroBatch


class TargetWorker:
    def __init__(self, *, rank: int, target_path: str, tap_ids: Sequence[int], device: str,
                 dtype: torch.dtype, num_slots: int, slot_numel: int,
                 node_id: Optional[str] = None, compile: bool = False,
                 final_hidden: bool = False) -> None:
        self.rank = rank
        self.device = actor_device(device)
        self.target = load_target(target_path, tap_ids, self.device, dtype, compile=compile,
                                  final_hidden=final_hidden)
        # Sized once for the largest micro-batch: [micro_batch, max_length, n_taps * H], or
        # (n_taps + 1) * H wide with the final hidden state (model/config.py, feature_width).
        self.ring = SlotRing(rank, num_slots, slot_numel, dtype, self.device, node_id)

    def ring_handle(self) -> RingHandle:
        return self.ring.handle()

    def produce(self, slot: int, batch: MicroBatch) -> SlotReady:
        """Tap features of ``batch`` into ``slot``; announced only once written."""
        start, t0 = time.time(), time.perf_counter()
        feats = self.target(batch.input_ids.to(self.device))
        self.ring.slot(slot, feats.shape).copy_(feats)
        ready = self.ring.publish(slot, feats.shape, batch.meta.sample_ids)
        # publish synchronised the device, so this time includes the GPU work.
        meta = ProduceMeta(step=batch.meta.step, index=batch.meta.index, start_s=start,
                           busy_s=time.perf_counter() - t0, on_main_thread=on_main_thread())
        return dataclasses.replace(ready, meta=meta)

    def close(self) -> None:
        """Free the ring's shared memory; call after every drafter closed its reader."""
        self.ring.close()
        release_manager_folder()  # the actor's last act: Ray kills its shm manager with it
