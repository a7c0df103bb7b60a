"""Slot-ring soak: 10,000 produce/consume cycles between two real processes, random delays,
tiny slots; no slot, mapping or shared-memory segment left behind.

A producer process owns a ``SlotRing``, a consumer process opens it once with a ``RingReader``,
and this process runs the ``SlotLedger`` as the driver does, passing only the small messages.
Random short sleeps (in the write, before the copy, before the ack) shuffle the interleavings;
every slot holds a pattern derived from its sample id, written in two halves, so a slot read
before it was published or overwritten before it was acked shows up as a wrong pattern.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import time

import pytest
import torch

from pipeline.transport.ledger import SlotLedger, SlotState
from pipeline.transport.ring import RingReader, SlotRing

CYCLES = 10_000
NUM_SLOTS = 3
WIDTH, MAX_ROWS = 4, 3


def _pattern(sample_id: int, rows: int) -> torch.Tensor:
    return sample_id * 100.0 + torch.arange(rows * WIDTH, dtype=torch.float32).view(rows, WIDTH)


def _jitter(rng: random.Random) -> None:
    if rng.random() < 0.2:
        time.sleep(rng.uniform(0, 3e-4))


def _mappings(name: str) -> int:
    """Lines of this process's memory map that map the segment ``name``."""
    with open("/proc/self/maps") as f:
        return sum(name in line for line in f)


def _producer(commands, out, seed: int) -> None:
    torch.set_num_threads(1)
    rng = random.Random(seed)
    ring = SlotRing(0, NUM_SLOTS, MAX_ROWS * WIDTH, torch.float32, "cpu")
    out.put(("handle", ring.handle()))
    while (cmd := commands.get()) is not None:
        slot, sample_id, rows = cmd
        view = ring.slot(slot, (rows, WIDTH))
        data = _pattern(sample_id, rows)
        view[:rows // 2 + 1].copy_(data[:rows // 2 + 1])  # in two halves, a pause between
        _jitter(rng)
        view[rows // 2 + 1:].copy_(data[rows // 2 + 1:])
        out.put(("ready", ring.publish(slot, (rows, WIDTH), (sample_id,))))
    ring.close()
    out.put(("closed", None))


def _consumer(commands, out, handle, seed: int) -> None:
    torch.set_num_threads(1)
    rng = random.Random(seed)
    name = handle.payload.args[1].decode().lstrip("/")
    reader = RingReader("cpu")
    reader.attach(handle)
    buffer = torch.empty(MAX_ROWS * WIDTH)
    while (ready := commands.get()) is not None:
        _jitter(rng)
        ack = reader.copy_out(ready, buffer)
        rows = ready.shape[0]
        ok = torch.equal(buffer[:rows * WIDTH].view(rows, WIDTH),
                         _pattern(ready.sample_ids[0], rows))
        _jitter(rng)  # the slot stays held a while after the copy
        out.put(("ack", (ack, ready.sample_ids[0], ok)))
    opened = _mappings(name)
    reader.close()
    out.put(("closed", (opened, _mappings(name))))


@pytest.mark.slow
def test_ten_thousand_cycles_leak_nothing():
    ctx = mp.get_context("spawn")
    to_producer, to_consumer, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    producer = ctx.Process(target=_producer, args=(to_producer, out, 1), daemon=True)
    producer.start()
    consumer = None
    try:
        kind, handle = out.get(timeout=120)
        assert kind == "handle"
        segment = "/dev/shm/" + handle.payload.args[1].decode().lstrip("/")
        assert os.path.exists(segment)
        consumer = ctx.Process(target=_consumer, args=(to_consumer, out, handle, 2), daemon=True)
        consumer.start()
        ledger, rng = SlotLedger({0: NUM_SLOTS}), random.Random(0)
        sent, acked, consumed = 0, 0, []
        while acked < CYCLES:
            while sent < CYCLES and (slot := ledger.acquire(0)) is not None:
                to_producer.put((slot, sent, rng.randint(1, MAX_ROWS)))
                sent += 1
            kind, msg = out.get(timeout=120)
            if kind == "ready":
                ledger.mark_ready(msg)
                to_consumer.put(ledger.take_ready())
            else:
                assert kind == "ack", kind
                ack, sample_id, ok = msg
                assert ok, f"sample {sample_id}: the slot did not hold what was published"
                ledger.release(ack)
                consumed.append(sample_id)
                acked += 1
        to_consumer.put(None)
        kind, (opened, after_close) = out.get(timeout=120)
        to_producer.put(None)
        assert out.get(timeout=120) == ("closed", None)
        producer.join(60)
        consumer.join(60)
    finally:
        for proc in (producer, consumer):
            if proc is not None and proc.is_alive():
                proc.kill()

    assert sorted(consumed) == list(range(CYCLES)), "a sample was lost or consumed twice"
    assert ledger.in_flight == 0 and ledger.num_ready == 0
    assert all(ledger.state(0, s) is SlotState.FREE for s in range(NUM_SLOTS))
    assert ledger.max_in_flight == NUM_SLOTS and ledger.waits > 0  # backpressure was exercised
    assert (opened, after_close) == (1, 0), "the consumer should map the ring once, then not"
    assert producer.exitcode == 0 and consumer.exitcode == 0
    # torch's shm manager unlinks the segment once both processes let go; it does so in its
    # own time, so look for a while rather than once.
    deadline = time.monotonic() + 30
    while os.path.exists(segment) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(segment), f"{segment} leaked"
