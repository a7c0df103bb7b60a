"""A ring of preallocated slots that moves hidden states from target actors to drafter actors.

One target owns one ``SlotRing``: a single allocation cut into ``num_slots`` slots, exported
once (one IPC handle for the whole ring). Each drafter holds a ``RingReader`` that opens every
target's ring once. Per micro-batch only small messages travel (``messages.py``):

    driver: slot = ledger.acquire(t)      -> target: ring.slot(slot, shape) ... ring.publish(...)
    driver: ledger.mark_ready(ready)      -> drafter: reader.copy_out(ready, out) -> SlotAck
    driver: ledger.release(ack)           -> the slot may be handed to the target again

Two orderings keep the data intact, and both are enforced here rather than left to callers:
the target's write has completed before ``SlotReady`` exists (``publish``), and the drafter's
copy has completed before ``SlotAck`` exists (``copy_out``). ``SlotLedger`` (``ledger.py``) makes
sure nobody writes a slot between those two points.
"""

from __future__ import annotations

import logging
import math
import uuid
from typing import Optional, Sequence

import torch

from pipeline.transport.ledger import SlotLedger, SlotState
from pipeline.transport.messages import ProduceMeta, RingHandle, SlotAck, SlotReady
from pipeline.transport.node import current_node_id
from pipeline.transport.shared import BufferPayload, close_export, export_buffer, open_buffer

# SlotLedger lives in its own torch-free module; it is re-exported as the ring's driver side.
__all__ = ["RingReader", "SlotLedger", "SlotRing", "SlotState"]

logger = logging.getLogger(__name__)


class SlotRing:
    """Producer side: owns the slot memory and hands out views to write into."""

    def __init__(self, target_rank: int, num_slots: int, slot_numel: int, dtype: torch.dtype,
                 device: torch.device | str, node_id: Optional[str] = None,
                 owner: str = "target") -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} is not allowed: expected >= 1")
        if slot_numel < 1:
            raise ValueError(f"slot_numel={slot_numel} is not allowed: expected >= 1")
        self.target_rank = target_rank
        self.owner = owner
        self.num_slots = num_slots
        self.slot_numel = slot_numel
        self.device = torch.device(device)
        # The node the memory lives on; consumers on other nodes refuse the ring.
        self.node_id = node_id if node_id is not None else current_node_id()
        # One allocation for all slots: one handle to share and one open per consumer.
        self._buffer: Optional[torch.Tensor] = torch.empty(num_slots * slot_numel, dtype=dtype,
                                                           device=self.device)
        self._payload: BufferPayload = export_buffer(self._buffer)
        # Slots handed out by slot() and not yet published, with the shape they were given.
        self._writing: dict[int, tuple[int, ...]] = {}
        self.ring_id = uuid.uuid4().hex

    @property
    def buffer(self) -> torch.Tensor:
        """All slots back to back, ``num_slots * slot_numel`` elements."""
        assert self._buffer is not None, f"ring of target {self.target_rank} is closed"
        return self._buffer

    def close(self) -> None:
        """Drop this process's reference to the slot memory.

        The memory goes away once every process that opened it has closed it as well (CPU: the
        /dev/shm segment is unlinked; CUDA: the block is freed once consumers released it).
        Actors killed with SIGKILL (``ray.kill``) never get here, and Ray then also kills torch's
        shm manager, so their CPU segments stay in /dev/shm: close rings before killing, then
        call ``release_manager_folder`` (pipeline/transport/shared.py), as the workers'
        ``close`` does, so that the manager's socket folder goes too.
        """
        if self._buffer is not None:
            self._buffer = None
            close_export(self._payload)
        self._writing.clear()

    def handle(self) -> RingHandle:
        """What consumers need to open this ring; the same handle every call."""
        return RingHandle(target_rank=self.target_rank, node_id=self.node_id,
                          num_slots=self.num_slots, slot_numel=self.slot_numel,
                          dtype=self._payload.dtype, device_kind=self._payload.device_kind,
                          payload=self._payload, ring_id=self.ring_id, owner=self.owner)

    def slot(self, index: int, shape: Sequence[int]) -> torch.Tensor:
        """A ``shape`` view of slot ``index`` to write into; ``publish`` it when written."""
        shape = _check_shape(shape, self.slot_numel)
        assert 0 <= index < self.num_slots, f"slot {index} out of range [0, {self.num_slots})"
        assert index not in self._writing, (
            f"target {self.target_rank}: slot {index} is already being written")
        self._writing[index] = shape
        return _slot_view(self.buffer, index, self.slot_numel, shape)

    def publish(self, index: int, shape: Sequence[int], sample_ids: Sequence[int],
                meta: Optional[ProduceMeta] = None) -> SlotReady:
        """Declare slot ``index`` written; the returned message may be sent to any consumer."""
        shape = tuple(int(s) for s in shape)
        assert index in self._writing, (
            f"target {self.target_rank}: publish of slot {index}, which was not given to this "
            f"producer (slots being written: {sorted(self._writing)})")
        assert self._writing[index] == shape, (
            f"target {self.target_rank}: slot {index} was given for shape {self._writing[index]}, "
            f"published as {shape}")
        if meta is not None and not isinstance(meta, ProduceMeta):
            raise ValueError(f"publish: meta must be a ProduceMeta or None, not "
                             f"{type(meta).__name__}")
        if self.device.type == "cuda":
            # Kernels run asynchronously: without this the consumer, in another process and on
            # another stream, can read the slot before the writes have landed (seen on 2x H200:
            # stale data in most messages once this line was disabled). Writes must be issued
            # on the current stream.
            torch.cuda.current_stream(self.device).synchronize()
        del self._writing[index]
        return SlotReady(target_rank=self.target_rank, slot=index, shape=shape,
                         sample_ids=tuple(int(i) for i in sample_ids), meta=meta)


class RingReader:
    """Consumer side: opens each target's ring once and copies slots out of it.

    ``node_id`` is the node this reader runs on (None outside Ray). A ring whose handle names
    another node is refused: CUDA IPC handles and shared-memory names mean nothing there (on a
    simulated multi-node cluster on one machine the open would even succeed and hide the
    mistake until a real cluster).
    """

    def __init__(self, device: torch.device | str, node_id: Optional[str] = None) -> None:
        self.device = torch.device(device)
        self.node_id = node_id
        self._rings: dict[int, tuple[RingHandle, torch.Tensor]] = {}

    def attach(self, handle: RingHandle) -> None:
        """Open ``handle``'s ring, once per ring; attaching the same ring again is a no-op.

        A new ring of an attached target rank (its target was restarted) replaces the old
        one: the old memory belongs to a dead producer and must never be read again.
        """
        if handle.target_rank in self._rings:
            old, _ = self._rings[handle.target_rank]
            if old.ring_id == handle.ring_id:
                logger.debug("ring of %s %d already attached", handle.owner, handle.target_rank)
                return
            logger.info("%s %d has a new ring: the old one is closed", handle.owner,
                        handle.target_rank)
            del self._rings[handle.target_rank]
        if handle.device_kind != self.device.type:
            raise ValueError(f"ring of {handle.owner} {handle.target_rank} lives on "
                             f"{handle.device_kind!r}, this reader on {self.device}")
        if handle.node_id is not None and self.node_id is not None \
                and handle.node_id != self.node_id:
            raise ValueError(f"ring of {handle.owner} {handle.target_rank} lives on node "
                             f"{handle.node_id}, this reader runs on node {self.node_id}: slot "
                             f"rings cannot be opened across nodes (CUDA IPC handles and "
                             f"shared-memory names hold only on the node that made them)")
        buffer = open_buffer(handle.payload, self.device)
        assert buffer.numel() == handle.num_slots * handle.slot_numel
        self._rings[handle.target_rank] = (handle, buffer)
        logger.info("attached ring of %s %d: %d slots x %d %s", handle.owner,
                    handle.target_rank, handle.num_slots, handle.slot_numel, handle.dtype)

    def close(self) -> None:
        """Unmap every attached ring (see ``SlotRing.close`` for when the memory goes away)."""
        self._rings.clear()

    def view(self, ready: SlotReady) -> torch.Tensor:
        """Zero-copy view of a ready slot, valid only until ``release_view``.

        Safe only while the slot is held (before the ack): the producer overwrites it
        afterwards. On CUDA the view cannot be sent on to another process; clone it first.
        """
        handle, buffer = self._ring(ready.target_rank)
        shape = _check_shape(ready.shape, handle.slot_numel)
        assert 0 <= ready.slot < handle.num_slots, (
            f"slot {ready.slot} out of range [0, {handle.num_slots})")
        return _slot_view(buffer, ready.slot, handle.slot_numel, shape)

    def release_view(self, ready: SlotReady) -> SlotAck:
        """Ack a slot read through ``view``, once every kernel reading it has finished."""
        self._wait()
        return SlotAck(target_rank=ready.target_rank, slot=ready.slot)

    def copy_out(self, ready: SlotReady, out: torch.Tensor) -> SlotAck:
        """Copy a ready slot into ``out`` (flat prefix, viewed as ``ready.shape``) and ack it.

        ``out`` is the caller's own preallocated, contiguous buffer on this reader's device;
        the copy lands in ``out.view(-1)[:numel].view(ready.shape)``.
        """
        src = self.view(ready)
        numel = src.numel()
        if out.device != src.device or out.dtype != src.dtype or not out.is_contiguous():
            raise ValueError(f"copy_out: out must be a contiguous {src.dtype} tensor on "
                             f"{src.device}, got {out.dtype} on {out.device} "
                             f"(contiguous={out.is_contiguous()})")
        if out.numel() < numel:
            raise ValueError(f"copy_out: out holds {out.numel()} elements, slot shape "
                             f"{ready.shape} needs {numel}")
        out.view(-1)[:numel].view(src.shape).copy_(src)
        return self.release_view(ready)

    def _ring(self, target_rank: int) -> tuple[RingHandle, torch.Tensor]:
        if target_rank not in self._rings:
            raise ValueError(f"ring of target {target_rank} is not attached "
                             f"(attached: {sorted(self._rings)})")
        return self._rings[target_rank]

    def _wait(self) -> None:
        if self.device.type == "cuda":
            # The ack lets the producer overwrite the slot: our reads must have finished first.
            torch.cuda.current_stream(self.device).synchronize()


def _check_shape(shape: Sequence[int], slot_numel: int) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"shape {shape} has a negative size")
    numel = math.prod(shape)
    if numel > slot_numel:
        raise ValueError(f"shape {shape} needs {numel} elements, more than the slot capacity "
                         f"of {slot_numel}; raise the ring's slot_numel")
    return shape


def _slot_view(buffer: torch.Tensor, index: int, slot_numel: int,
               shape: tuple[int, ...]) -> torch.Tensor:
    start = index * slot_numel
    return buffer[start:start + math.prod(shape)].view(shape)
