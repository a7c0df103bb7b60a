"""SlotLedger: the driver's slot states, its backpressure and its refusal of illegal moves."""

import pytest

from pipeline.transport.ledger import SlotLedger, SlotState
from pipeline.transport.messages import SlotAck, SlotReady


def _ready(target: int, slot: int, *ids: int) -> SlotReady:
    return SlotReady(target_rank=target, slot=slot, shape=(len(ids), 4), sample_ids=ids)


def test_full_cycle_and_counters():
    ledger = SlotLedger({0: 2})
    a, b = ledger.acquire(0), ledger.acquire(0)
    assert (a, b) == (0, 1) and ledger.in_flight == 2
    assert ledger.acquire(0) is None and ledger.waits == 1
    ledger.mark_ready(_ready(0, b, 7))
    ledger.mark_ready(_ready(0, a, 8))
    assert ledger.take_ready().sample_ids == (7,)  # FIFO by readiness, not by slot index
    assert ledger.state(0, b) is SlotState.READING and ledger.state(0, a) is SlotState.READY
    ledger.release(SlotAck(0, b))
    assert ledger.acquire(0) == b
    assert ledger.max_in_flight == 2 and ledger.in_flight == 2 and ledger.in_flight_of(0) == 2


def test_any_consumer_takes_any_target_in_ready_order():
    ledger = SlotLedger({0: 1, 1: 1})
    s0, s1 = ledger.acquire(0), ledger.acquire(1)
    ledger.mark_ready(_ready(1, s1, 2))
    ledger.mark_ready(_ready(0, s0, 1))
    assert [ledger.take_ready().target_rank for _ in range(2)] == [1, 0]
    assert ledger.take_ready() is None


def test_take_ready_can_skip_slots_that_must_wait():
    ledger = SlotLedger({0: 3})
    for ids in [(1,), (2,), (3,)]:
        ledger.mark_ready(_ready(0, ledger.acquire(0), *ids))
    assert ledger.take_ready(lambda r: r.sample_ids[0] > 1).sample_ids == (2,)
    assert ledger.take_ready(lambda r: False) is None and ledger.num_ready == 2
    assert [ledger.take_ready().sample_ids for _ in range(2)] == [(1,), (3,)]  # order kept
    assert ledger.num_ready == 0


def test_backpressure_blocks_reuse_until_the_ack():
    """A driver that handed a slot back before the ack would need acquire to succeed here."""
    ledger = SlotLedger({0: 1})
    slot = ledger.acquire(0)
    ledger.mark_ready(_ready(0, slot, 1))
    ledger.take_ready()
    assert ledger.acquire(0) is None
    ledger.release(SlotAck(0, slot))
    assert ledger.acquire(0) == slot


@pytest.mark.parametrize("steps, message", [
    (["ready"], "FREE -> READY"),
    (["acquire", "release"], "WRITING -> FREE"),
    (["acquire", "ready", "release"], "READY -> FREE"),
    (["acquire", "ready", "ready"], "READY -> READY"),
    (["acquire", "ready", "take", "ready"], "READING -> READY"),
    (["acquire", "ready", "take", "release", "release"], "FREE -> FREE"),
])
def test_illegal_transitions_fail_with_the_states(steps, message):
    ledger = SlotLedger({0: 1})
    actions = {"acquire": lambda: ledger.acquire(0),
               "ready": lambda: ledger.mark_ready(_ready(0, 0, 5)),
               "take": ledger.take_ready,
               "release": lambda: ledger.release(SlotAck(0, 0))}
    for step in steps[:-1]:
        actions[step]()
    with pytest.raises(AssertionError, match=f"target 0, slot 0: illegal transition {message}"):
        actions[steps[-1]]()


def test_unknown_target_and_slot_are_refused():
    ledger = SlotLedger({0: 1})
    with pytest.raises(AssertionError, match="unknown target 3"):
        ledger.acquire(3)
    with pytest.raises(AssertionError, match="slot 4 out of range"):
        ledger.release(SlotAck(0, 4))


@pytest.mark.parametrize("slots", [{}, {0: 0}])
def test_bad_configuration_is_a_value_error(slots):
    with pytest.raises(ValueError):
        SlotLedger(slots)
