"""A drafter's weights on their way to the tau evaluator (its own actor).

Two ways, chosen per evaluation by the driver (pipeline/driver/evaluator.py):

- :class:`Weights`, a CPU copy of the state dict through Ray's object store: any node, any
  layout. At the 8B recipe that is 4.2 GB copied to host memory and serialised in drafter
  rank 0's one thread, behind the step it follows, while training waits for that rank.
- :class:`WeightsSnapshot`: the state dict copied on the drafter's own device into a one-slot
  ring (pipeline/transport/ring.py, CUDA IPC or CPU shared memory, allocated on first use and
  then kept), and only this small message sent. The evaluator opens the ring once, copies the
  slot into its model and lets go. Same node only (as every ring), and the driver sends the
  next snapshot only after the evaluation that read the last one is back.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Optional

import torch

from pipeline.transport.messages import RingHandle, SlotReady
from pipeline.transport.ring import SlotRing

log = logging.getLogger(__name__)

Weights = dict[str, torch.Tensor]

# Each tensor starts at a multiple of this many bytes of the slot, so a byte range can be
# viewed as any dtype (and stays aligned for vectorised copies).
_ALIGN = 64


@dataclass(frozen=True)
class Entry:
    """Where one state-dict tensor lies in the snapshot slot."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int  # bytes from the slot's start

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class WeightsSnapshot:
    """Weights left in drafter rank 0's snapshot ring: what the evaluator needs to read them."""

    ring: RingHandle
    ready: SlotReady
    layout: tuple[Entry, ...]


def weights_of(model: torch.nn.Module) -> Weights:
    """A CPU copy of ``model``'s state dict, safe to put in the object store while the model
    keeps training."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def layout_of(state: Weights) -> tuple[tuple[Entry, ...], int]:
    """Each tensor's place in a flat byte slot, and the slot's size in bytes."""
    entries, offset = [], 0
    for name, t in state.items():
        entry = Entry(name, tuple(t.shape), t.dtype, offset)
        entries.append(entry)
        offset += -(-entry.nbytes // _ALIGN) * _ALIGN
    return tuple(entries), max(offset, _ALIGN)


def _view(flat: torch.Tensor, entry: Entry) -> torch.Tensor:
    return flat[entry.offset:entry.offset + entry.nbytes].view(entry.dtype).view(entry.shape)


def unpack(flat: torch.Tensor, layout: tuple[Entry, ...]) -> Weights:
    """Views of ``flat`` (a uint8 slot) as the state dict ``layout`` describes: no copy."""
    return {e.name: _view(flat, e) for e in layout}


class SnapshotRing:
    """Drafter rank 0's side: :meth:`put` copies a state dict into the one slot and publishes it.

    The slot is allocated on the first :meth:`put` (the first evaluation, before training) and
    kept: same-sized weights every time. Where it does not fit on the device, one warning and
    :meth:`put` answers None from then on (the caller sends the weights the other way).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.ring: Optional[SlotRing] = None
        self.layout: tuple[Entry, ...] = ()
        self.nbytes = 0
        self.unavailable = False

    def put(self, state: Weights) -> Optional[WeightsSnapshot]:
        if self.unavailable:
            return None
        layout, nbytes = layout_of(state)
        if self.ring is None:
            self.layout, self.nbytes = layout, nbytes
            try:
                self.ring = SlotRing(0, 1, self.nbytes, torch.uint8, self.device, owner="drafter")
            except torch.OutOfMemoryError:
                self.unavailable = True
                log.warning("the weights snapshot for the tau evaluator (%.2f GB) does not fit "
                            "on %s: evaluations get the weights through Ray's object store "
                            "(train.eval.weights_ring=false says so up front)",
                            self.nbytes / 1e9, self.device)
                return None
        assert layout == self.layout, "the drafter's state dict changed its layout"
        slot = self.ring.slot(0, (self.nbytes,))
        with torch.no_grad():
            for entry in self.layout:
                _view(slot, entry).copy_(state[entry.name])
        ready = self.ring.publish(0, (self.nbytes,), sample_ids=())
        return WeightsSnapshot(ring=self.ring.handle(), ready=ready, layout=self.layout)

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None
