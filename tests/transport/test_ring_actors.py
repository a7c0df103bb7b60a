"""SlotRing, RingReader and SlotLedger together, across real Ray actors, under adversarial timing.

Every element written is derived from its sample id and position, so a consumer can tell a slot
that was overwritten, stale, shifted or half-written from the one it was promised.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

import pytest
import ray
import torch

from pipeline.transport.messages import RingHandle, SlotAck, SlotReady
from pipeline.transport.ring import RingReader, SlotLedger, SlotRing

HIDDEN, MAX_ROWS, MAX_SEQ = 8, 3, 16
SLOT_NUMEL = MAX_ROWS * MAX_SEQ * HIDDEN


def pattern(shape: Sequence[int], sample_ids: Sequence[int]) -> torch.Tensor:
    """Row b holds ``sample_ids[b] * 4096 + position``; exact in float32 for ids below 4096."""
    per_row = math.prod(shape[1:])
    assert len(sample_ids) == shape[0] and per_row < 4096 and max(sample_ids) < 4096
    ids = torch.tensor(sample_ids, dtype=torch.float32).view(-1, 1)
    return (ids * 4096 + torch.arange(per_row, dtype=torch.float32)).view(tuple(shape))


class PatternProducer:
    """Target stand-in: writes ``pattern`` into ring slots, pausing halfway when asked to."""

    def __init__(self, rank: int, device: str = "cpu") -> None:
        self.rank, self.device = rank, device
        self.rng = random.Random(rank)
        self.ring: SlotRing | None = None
        self.max_delay_s = 0.0

    def configure(self, num_slots: int, max_delay_s: float) -> RingHandle:
        self.close()
        self.ring = SlotRing(self.rank, num_slots, SLOT_NUMEL, torch.float32, self.device)
        self.max_delay_s = max_delay_s
        return self.ring.handle()

    def write(self, slot: int, shape: tuple[int, ...], sample_ids: tuple[int, ...]) -> SlotReady:
        flat = self.ring.slot(slot, shape).view(-1)
        data = pattern(shape, sample_ids).view(-1).to(flat.device)
        half = data.numel() // 2
        flat[:half].copy_(data[:half])
        time.sleep(self.rng.uniform(0, self.max_delay_s))  # a slow write, caught half done
        flat[half:].copy_(data[half:])
        return self.ring.publish(slot, shape, sample_ids)

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()


@dataclass(frozen=True)
class ConsumerReport:
    sample_ids: tuple[int, ...]
    errors: tuple[str, ...]


class CheckingConsumer:
    """Drafter stand-in: copies each slot into its own buffer and checks every element."""

    def __init__(self, seed: int, device: str = "cpu") -> None:
        self.device = device
        self.rng = random.Random(1000 + seed)
        self.reader = RingReader(device)

    def configure(self, handles: Sequence[RingHandle], max_delay_s: float) -> None:
        self.reader.close()
        self.reader = RingReader(self.device)
        for handle in handles:
            self.reader.attach(handle)
        self.out = torch.full((SLOT_NUMEL,), float("nan"), device=self.device)
        self.max_delay_s = max_delay_s
        self.seen: list[int] = []
        self.errors: list[str] = []

    def consume(self, ready: SlotReady) -> SlotAck:
        time.sleep(self.rng.uniform(0, self.max_delay_s))  # a slow reader: the slot stays READING
        ack = self.reader.copy_out(ready, self.out)
        got = self.out[:math.prod(ready.shape)].view(ready.shape).cpu()
        wrong = int((got != pattern(ready.shape, ready.sample_ids)).sum())
        if wrong:
            self.errors.append(f"target {ready.target_rank} slot {ready.slot} samples "
                               f"{ready.sample_ids}: {wrong} of {got.numel()} elements wrong")
        self.seen.extend(ready.sample_ids)
        return ack

    def report(self) -> ConsumerReport:
        return ConsumerReport(tuple(self.seen), tuple(self.errors))

    def close(self) -> None:
        self.reader.close()


@dataclass(frozen=True)
class Job:
    target: int
    shape: tuple[int, ...]
    sample_ids: tuple[int, ...]


def make_jobs(num_targets: int, num_messages: int, seed: int) -> list[Job]:
    """Micro-batches of 1..MAX_ROWS samples and 1..MAX_SEQ positions, targets in turn."""
    rng, next_id, jobs = random.Random(seed), 0, []
    for i in range(num_messages):
        rows = rng.randint(1, MAX_ROWS)
        shape = (rows, rng.randint(1, MAX_SEQ), HIDDEN)
        jobs.append(Job(i % num_targets, shape, tuple(range(next_id, next_id + rows))))
        next_id += rows
    return jobs


def drive(producers: list[Any], consumers: list[Any], ledger: SlotLedger,
          jobs: list[Job]) -> dict[int, int]:
    """The driver loop as the pipeline runs it; returns each target's peak of slots in flight."""
    todo, idle = deque(jobs), deque(consumers)
    pending: dict[Any, Any] = {}  # ObjectRef -> the consumer working on it (None for a write)
    peak = {t: 0 for t in range(len(producers))}
    while todo or ledger.in_flight:
        while todo:  # start writes while the head job's target has a free slot
            slot = ledger.acquire(todo[0].target)
            if slot is None:
                break  # backpressure: wait for an ack below
            job = todo.popleft()
            pending[producers[job.target].write.remote(slot, job.shape, job.sample_ids)] = None
            peak[job.target] = max(peak[job.target], ledger.in_flight_of(job.target))
        while idle and (ready := ledger.take_ready()) is not None:
            consumer = idle.popleft()
            pending[consumer.consume.remote(ready)] = consumer
        [ref], _ = ray.wait(list(pending), num_returns=1)
        consumer, message = pending.pop(ref), ray.get(ref)
        if consumer is None:
            ledger.mark_ready(message)
        else:
            ledger.release(message)
            idle.append(consumer)
    return peak


def stop(actors: Sequence[Any]) -> None:
    """Close rings before killing: a SIGKILLed owner would leave its segment in /dev/shm."""
    ray.get([a.close.remote() for a in actors])
    for actor in actors:
        ray.kill(actor)


@pytest.fixture(scope="module")
def actors(ray_session):
    producers = [ray.remote(PatternProducer).remote(rank) for rank in range(2)]
    consumers = [ray.remote(CheckingConsumer).remote(seed) for seed in range(2)]
    yield producers, consumers
    stop(producers + consumers)


def run_case(producers, consumers, num_slots, producer_delay_s, consumer_delay_s, num_messages,
             seed):
    handles = ray.get([p.configure.remote(num_slots, producer_delay_s) for p in producers])
    ray.get([c.configure.remote(handles, consumer_delay_s) for c in consumers])
    ledger = SlotLedger({rank: num_slots for rank in range(len(producers))})
    jobs = make_jobs(len(producers), num_messages, seed)
    peak = drive(producers, consumers, ledger, jobs)
    return ledger, peak, jobs, ray.get([c.report.remote() for c in consumers])


# (slots per ring, max producer delay, max consumer delay, producers, consumers)
CASES = [
    pytest.param(1, 0.0, 0.02, 1, 1, id="slow-consumer-1-slot"),
    pytest.param(8, 0.0, 0.03, 1, 2, id="slow-consumers-8-slots"),
    pytest.param(1, 0.02, 0.0, 1, 1, id="slow-producer-1-slot"),
    pytest.param(8, 0.02, 0.0, 1, 2, id="slow-producer-8-slots-2-consumers"),
    pytest.param(3, 0.01, 0.01, 2, 2, id="jitter-2-producers-2-consumers"),
]


@pytest.mark.parametrize(
    "num_slots, producer_delay_s, consumer_delay_s, num_producers, num_consumers", CASES)
def test_every_sample_arrives_once_and_intact(actors, num_slots, producer_delay_s, consumer_delay_s,
                                              num_producers, num_consumers):
    producers, consumers = actors[0][:num_producers], actors[1][:num_consumers]
    ledger, peak, jobs, reports = run_case(producers, consumers, num_slots, producer_delay_s,
                                           consumer_delay_s, num_messages=24, seed=num_slots)
    assert [e for r in reports for e in r.errors] == []
    expected = sorted(i for job in jobs for i in job.sample_ids)
    assert sorted(i for r in reports for i in r.sample_ids) == expected  # each exactly once
    assert all(r.sample_ids for r in reports)  # every consumer took part
    assert all(p <= num_slots for p in peak.values()), peak
    assert ledger.max_in_flight <= num_slots * num_producers and ledger.in_flight == 0
    assert ledger.waits > 0  # the loop did hit a full ring and waited for acks


def test_checker_catches_a_slot_overwritten_before_its_ack(actors):
    """Without the ack protocol the test above would fail: an early reuse is detected."""
    producer, consumer = actors[0][0], actors[1][0]
    handle = ray.get(producer.configure.remote(1, 0.0))
    ray.get(consumer.configure.remote([handle], 0.0))
    first = ray.get(producer.write.remote(0, (2, 4, HIDDEN), (1, 2)))
    # A broken driver: slot 0 goes back to the producer before the consumer has acked it.
    ray.get(producer.write.remote(0, (1, 4, HIDDEN), (3,)))
    ray.get(consumer.consume.remote(first))
    errors = ray.get(consumer.report.remote()).errors
    assert len(errors) == 1 and "samples (1, 2): 32 of 64 elements wrong" in errors[0]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_every_sample_arrives_intact_between_two_gpus(gpus_free):
    options = {"num_gpus": 1}
    producer = ray.remote(PatternProducer).options(**options).remote(0, "cuda")
    consumer = ray.remote(CheckingConsumer).options(**options).remote(0, "cuda")
    try:
        ledger, peak, jobs, [report] = run_case([producer], [consumer], 4, 0.005, 0.005, 40, seed=7)
        assert report.errors == ()
        assert sorted(report.sample_ids) == sorted(i for job in jobs for i in job.sample_ids)
        assert peak[0] <= 4 and ledger.waits > 0
    finally:
        stop([producer, consumer])
