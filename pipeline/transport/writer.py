"""A second writer of another process's ring: target stages writing their taps' columns.

A staged target's tap ring is owned by its last stage, which publishes each slot; the earlier
stages write the columns of the taps they hold into the same slot first. Each opens the ring
once (``SlotWriter``) and writes only slots the driver gave the target, i.e. slots the ledger
holds in WRITING until the last stage publishes. ``finish`` synchronises the device before the
stage's message to the next stage exists, so the owner's ``publish`` (itself synchronised)
covers every stage's writes.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from pipeline.transport.messages import RingHandle
from pipeline.transport.shared import open_buffer


class SlotWriter:
    """Opens a ring owned elsewhere once and hands out views of its slots to write into."""

    def __init__(self, handle: RingHandle, device: torch.device | str,
                 node_id: Optional[str] = None) -> None:
        self.device = torch.device(device)
        if handle.device_kind != self.device.type:
            raise ValueError(f"ring of target {handle.target_rank} lives on "
                             f"{handle.device_kind!r}, this writer on {self.device}")
        if handle.node_id is not None and node_id is not None and handle.node_id != node_id:
            raise ValueError(f"ring of target {handle.target_rank} lives on node "
                             f"{handle.node_id}, this writer runs on node {node_id}: the "
                             f"stages of a target must share a node")
        self.handle = handle
        self._buffer: Optional[torch.Tensor] = open_buffer(handle.payload, self.device)

    def slot(self, index: int, shape: Sequence[int]) -> torch.Tensor:
        """A ``shape`` view of slot ``index``; the owner publishes it later."""
        assert self._buffer is not None, "writer is closed"
        shape = tuple(int(s) for s in shape)
        numel = math.prod(shape)
        h = self.handle
        assert 0 <= index < h.num_slots, f"slot {index} out of range [0, {h.num_slots})"
        if numel > h.slot_numel:
            raise ValueError(f"shape {shape} needs {numel} elements, more than the slot "
                             f"capacity of {h.slot_numel}")
        start = index * h.slot_numel
        return self._buffer[start:start + numel].view(shape)

    def finish(self) -> None:
        """Writes issued so far have landed: call before telling anyone the slot moved on."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def close(self) -> None:
        self._buffer = None
