"""SlotRing -> RingReader over CUDA IPC between two Ray actors sharing one GPU (cluster=one_gpu).

Each actor asks for half a GPU, so Ray gives both the same device. The producer's writes are
queued behind a GPU spin (``torch.cuda._sleep``), and so are the consumer's reads: without the
ring's stream synchronisations (``publish`` before SlotReady, ``copy_out`` before SlotAck) the
consumer would read slots not yet written and the producer overwrite slots not yet read.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass

import pytest
import ray
import torch

from pipeline.transport.messages import RingHandle, SlotAck, SlotReady
from pipeline.transport.ring import RingReader, SlotLedger, SlotRing

HIDDEN, MAX_ROWS, MAX_SEQ = 64, 4, 256
SLOT_NUMEL = MAX_ROWS * MAX_SEQ * HIDDEN
NUM_SLOTS = 3
SPIN_CYCLES = 2_000_000  # ~1 ms of GPU time queued before each write and each read


def pattern(shape, sample_ids, device) -> torch.Tensor:
    """Row b holds ``sample_ids[b] * 2**17 + position``: exact in float32, unique per sample."""
    per_row = math.prod(shape[1:])
    ids = torch.tensor(sample_ids, dtype=torch.float32, device=device).view(-1, 1)
    return (ids * 2 ** 17 + torch.arange(per_row, dtype=torch.float32, device=device)).view(shape)


def gpu_identity(device: str) -> str:
    return str(torch.cuda.get_device_properties(0).uuid) if device == "cuda" else "cpu"


class Producer:
    def __init__(self, device: str) -> None:
        self.device = device
        self.ring = SlotRing(0, NUM_SLOTS, SLOT_NUMEL, torch.float32, device)

    def handle(self) -> RingHandle:
        return self.ring.handle()

    def identity(self) -> str:
        return gpu_identity(self.device)

    def write(self, slot: int, shape: tuple[int, ...], sample_ids: tuple[int, ...]) -> SlotReady:
        if self.device == "cuda":
            torch.cuda._sleep(SPIN_CYCLES)  # the write below lands late, asynchronously
        self.ring.slot(slot, shape).copy_(pattern(shape, sample_ids, self.device))
        return self.ring.publish(slot, shape, sample_ids)

    def close(self) -> None:
        self.ring.close()


@dataclass(frozen=True)
class Report:
    sample_ids: tuple[int, ...]
    errors: tuple[str, ...]


class Consumer:
    def __init__(self, device: str) -> None:
        self.device = device
        self.reader = RingReader(device)
        self.out = torch.full((SLOT_NUMEL,), float("nan"), device=device)
        self.seen: list[int] = []
        self.errors: list[str] = []

    def attach(self, handle: RingHandle) -> str:
        self.reader.attach(handle)
        return gpu_identity(self.device)

    def consume(self, ready: SlotReady) -> SlotAck:
        if self.device == "cuda":
            torch.cuda._sleep(SPIN_CYCLES)  # the copy below runs late, asynchronously
        ack = self.reader.copy_out(ready, self.out)
        self.check(ready)
        return ack

    def check(self, ready: SlotReady) -> None:
        got = self.out[:math.prod(ready.shape)].view(ready.shape)
        wrong = int((got != pattern(ready.shape, ready.sample_ids, self.device)).sum())
        if wrong:
            self.errors.append(f"slot {ready.slot} samples {ready.sample_ids}: "
                               f"{wrong} of {got.numel()} elements wrong")
        self.seen.extend(ready.sample_ids)

    def report(self) -> Report:
        return Report(tuple(self.seen), tuple(self.errors))

    def close(self) -> None:
        self.reader.close()


@pytest.fixture()
def pair(gpus_free, device):
    if device == "cuda":
        gpus = ray.cluster_resources().get("GPU", 0)
        assert gpus >= 1, f"the test Ray cluster sees {gpus} GPUs: ray.init must autodetect them"
    options = {"num_gpus": 0.5 if device == "cuda" else 0, "num_cpus": 1}
    producer = ray.remote(Producer).options(**options).remote(device)
    consumer = ray.remote(Consumer).options(**options).remote(device)
    yield producer, consumer
    ray.get([producer.close.remote(), consumer.close.remote()])
    ray.kill(producer)
    ray.kill(consumer)


def jobs(num_messages: int):
    next_id = 0
    for i in range(num_messages):
        rows = 1 + i % MAX_ROWS
        shape = (rows, 17 + (37 * i) % (MAX_SEQ - 17), HIDDEN)
        yield shape, tuple(range(next_id, next_id + rows))
        next_id += rows


def test_slots_cross_between_actors_on_one_gpu_intact(pair, device):
    producer, consumer = pair
    handle = ray.get(producer.handle.remote())
    assert ray.get(consumer.attach.remote(handle)) == ray.get(producer.identity.remote())
    ledger = SlotLedger({0: NUM_SLOTS})
    todo, pending = deque(jobs(24)), {}
    uses, busy, expected = Counter(), False, []
    while todo or ledger.in_flight:
        while todo and (slot := ledger.acquire(0)) is not None:
            shape, ids = todo.popleft()
            expected.extend(ids)
            uses[slot] += 1
            pending[producer.write.remote(slot, shape, ids)] = "write"
        if not busy and (ready := ledger.take_ready()) is not None:
            pending[consumer.consume.remote(ready)], busy = "read", True
        [ref], _ = ray.wait(list(pending), num_returns=1)
        message = ray.get(ref)
        if pending.pop(ref) == "write":
            ledger.mark_ready(message)
        else:
            ledger.release(message)
            busy = False
    report = ray.get(consumer.report.remote())
    assert report.errors == ()
    assert sorted(report.sample_ids) == sorted(expected)  # each sample exactly once
    assert ledger.in_flight == 0 and ledger.max_in_flight == NUM_SLOTS
    assert ledger.waits > 0  # the ring did fill up and writes waited for acks
    assert sorted(uses) == list(range(NUM_SLOTS)) and min(uses.values()) >= 4  # reuse rounds


def test_a_slot_overwritten_before_its_ack_is_caught(pair):
    """The check above is sharp: a broken driver that reuses a slot early is detected."""
    producer, consumer = pair
    ray.get(consumer.attach.remote(ray.get(producer.handle.remote())))
    first = ray.get(producer.write.remote(0, (2, 8, HIDDEN), (1, 2)))
    ray.get(producer.write.remote(0, (1, 8, HIDDEN), (3,)))  # slot 0 reused before the ack
    ray.get(consumer.consume.remote(first))
    [error] = ray.get(consumer.report.remote()).errors
    assert f"samples (1, 2): {8 * HIDDEN} of {16 * HIDDEN} elements wrong" in error
