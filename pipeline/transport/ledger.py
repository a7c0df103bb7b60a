"""The driver's book of every ring slot: who may write, who may read, and when it is free again.

Pure python (no torch) so the driver can reason about slots without touching devices. Each slot
moves FREE -> WRITING -> READY -> READING -> FREE:

- ``acquire(target)``: FREE -> WRITING, the slot index to send the target; None when all of that
  target's slots are busy, which is the backpressure: the driver waits for an ack instead.
- ``mark_ready(SlotReady)``: WRITING -> READY, queued for any consumer (FIFO).
- ``take_ready(where=None)``: READY -> READING, the oldest ready slot of any target (that
  ``where`` accepts).
- ``release(SlotAck)``: READING -> FREE.

Anything else is a protocol bug in the driver and fails an assertion naming the slot and states.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Callable, Mapping, Optional

from pipeline.transport.messages import SlotAck, SlotReady


class SlotState(enum.Enum):
    FREE = "free"
    WRITING = "writing"
    READY = "ready"
    READING = "reading"


class SlotLedger:
    """Tracks the slots of every target's ring; see the module docstring for the states."""

    def __init__(self, slots_per_target: Mapping[int, int]) -> None:
        if not slots_per_target:
            raise ValueError("slots_per_target is empty: expected at least one target")
        for target, n in slots_per_target.items():
            if n < 1:
                raise ValueError(f"slots_per_target[{target}]={n} is not allowed: expected >= 1")
        self._state = {t: [SlotState.FREE] * n for t, n in slots_per_target.items()}
        # Least recently freed first, so a slot rests as long as possible before reuse.
        self._free = {t: deque(range(n)) for t, n in slots_per_target.items()}
        self._ready: deque[SlotReady] = deque()
        self._in_flight = 0
        self.max_in_flight = 0
        self.waits = 0

    @property
    def in_flight(self) -> int:
        """Slots acquired and not yet released, over all targets."""
        return self._in_flight

    def in_flight_of(self, target: int) -> int:
        return sum(s is not SlotState.FREE for s in self._states(target))

    def state(self, target: int, slot: int) -> SlotState:
        return self._states(target)[slot]

    def acquire(self, target: int) -> Optional[int]:
        """A free slot of ``target``, now WRITING; None (and one more wait) when none is free."""
        free = self._free_of(target)
        if not free:
            self.waits += 1
            return None
        slot = free.popleft()
        self._move(target, slot, SlotState.FREE, SlotState.WRITING)
        self._in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self._in_flight)
        return slot

    def mark_ready(self, ready: SlotReady) -> None:
        self._move(ready.target_rank, ready.slot, SlotState.WRITING, SlotState.READY)
        self._ready.append(ready)

    @property
    def num_ready(self) -> int:
        """Slots written and waiting for a consumer."""
        return len(self._ready)

    def take_ready(self, where: Optional[Callable[[SlotReady], bool]] = None,
                   ) -> Optional[SlotReady]:
        """The oldest ready slot of any target, now READING; None when nothing is ready.

        ``where`` skips slots it rejects, which stay queued in order: the driver uses it to hold
        back the next step's micro-batches until the current step is dispatched.
        """
        for i, ready in enumerate(self._ready):
            if where is None or where(ready):
                del self._ready[i]
                self._move(ready.target_rank, ready.slot, SlotState.READY, SlotState.READING)
                return ready
        return None

    def release(self, ack: SlotAck) -> None:
        self._move(ack.target_rank, ack.slot, SlotState.READING, SlotState.FREE)
        self._free[ack.target_rank].append(ack.slot)
        self._in_flight -= 1

    def _move(self, target: int, slot: int, expected: SlotState, new: SlotState) -> None:
        states = self._states(target)
        assert 0 <= slot < len(states), (
            f"target {target}: slot {slot} out of range [0, {len(states)})")
        assert states[slot] is expected, (
            f"target {target}, slot {slot}: illegal transition {states[slot].name} -> {new.name} "
            f"(only {expected.name} -> {new.name} is allowed)")
        states[slot] = new

    def _states(self, target: int) -> list[SlotState]:
        assert target in self._state, f"unknown target {target} (known: {sorted(self._state)})"
        return self._state[target]

    def _free_of(self, target: int) -> deque[int]:
        self._states(target)
        return self._free[target]
