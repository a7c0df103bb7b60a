"""Small messages that cross Ray between target actors, drafter actors and the driver.

Only these travel per micro-batch; the hidden states themselves stay in a slot ring that each
consumer opened once (see ``ring.py``). Everything here is frozen and made of plain data so a
message can be pickled, logged and compared without touching torch state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch

DeviceKind = Literal["cuda", "cpu"]


@dataclass(frozen=True)
class RingHandle:
    """What a consumer needs to open a target's slot ring; sent once at start-up.

    ``payload`` is the opaque result of ``shared.export_buffer``; only ``shared.open_buffer``
    reads it. ``node_id`` lets the driver check that producer and consumer share a node, since
    neither CUDA IPC nor shared memory reaches across nodes.
    """

    target_rank: int
    node_id: Optional[str]
    num_slots: int
    slot_numel: int
    dtype: torch.dtype
    device_kind: DeviceKind
    payload: Any
    # Tells one ring of a target rank from the next (a restarted target makes a new ring).
    ring_id: str = ""
    # Who writes it, for messages: a target, or the drafter whose weights snapshot it holds
    # for the tau evaluator (pipeline/workers/weights.py).
    owner: str = "target"


@dataclass(frozen=True)
class ProduceMeta:
    """Rides on a SlotReady: which micro-batch the slot holds, and what producing it cost."""

    step: int
    index: int
    start_s: float
    busy_s: float
    on_main_thread: bool


@dataclass(frozen=True)
class SlotReady:
    """A target finished writing ``shape`` elements into ``slot`` for ``sample_ids``.

    ``meta`` is filled in by the target once the slot is published (the cost is known only
    then); plain numbers, never tensors, which would be copied through Ray's object store.
    """

    target_rank: int
    slot: int
    shape: tuple[int, ...]
    sample_ids: tuple[int, ...]
    meta: Optional[ProduceMeta] = None


@dataclass(frozen=True)
class SlotAck:
    """A consumer finished copying ``slot`` of ``target_rank``: the target may overwrite it."""

    target_rank: int
    slot: int
