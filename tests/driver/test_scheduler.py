"""The real StepLoop over plain fake actors: no model, real Ray, a real slot ring on CPU.

The fakes check the loop's promises themselves: a target refuses to overwrite a slot that no
drafter has copied yet (backpressure), and a drafter refuses a micro-batch whose slot holds
other samples. A file gate makes drafter 0 finish step 0 only after drafter 1 finished step 1,
so results arrive out of order by construction, not by timing. (The gated run needs a spare
slot: drafter 0's queued loads hold theirs until the gate opens.)

After-step calls (checkpoint saves, tau evaluations) are handed to their handlers in the order
they were queued within a lane, whatever order Ray reports them in; another lane does not
wait for them; a call with ``on_error`` costs only itself when it fails.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import pytest
import ray
import torch
from ray.exceptions import RayActorError, RayTaskError

from pipeline.driver.scheduler import AfterStepCall, StepLoop, StepReport, Topology
from pipeline.runtime.ray_start import Placement, kill_actors, start_actor
from pipeline.transport.messages import ProduceMeta, RingHandle, SlotAck, SlotReady
from pipeline.transport.ring import RingReader, SlotRing
from pipeline.workers.messages import MicroBatch, MicroBatchMeta, MicroResult, StepResult

WIDTH = 4  # slot elements per sample
MAX_ROWS = 2
CONSUMED = -1.0  # what a drafter leaves in a slot once it copied it


def plan(num_steps: int, per_step: int) -> list[list[tuple[int, ...]]]:
    """Sample ids of each micro-batch of each step: two samples each, all distinct."""
    ids = iter(range(1000))
    return [[(next(ids), next(ids)) for _ in range(per_step)] for _ in range(num_steps)]


class FakePrefetcher:
    def __init__(self, *, steps: list[list[tuple[int, ...]]]) -> None:
        self.reset(steps)

    def reset(self, steps: list[list[tuple[int, ...]]]) -> None:
        self.order = [(s, i, ids) for s, mbs in enumerate(steps) for i, ids in enumerate(mbs)]
        self.steps = steps

    def next_micro_batch(self) -> tuple[Optional[MicroBatchMeta], Optional[MicroBatch]]:
        if not self.order:
            return None, None
        step, index, ids = self.order.pop(0)
        meta = MicroBatchMeta(step=step, epoch=0, index=index, num_in_step=len(self.steps[step]),
                              sample_ids=ids, shape=(len(ids), WIDTH))
        tokens = torch.tensor(ids).view(-1, 1).repeat(1, WIDTH)
        return meta, MicroBatch(meta, tokens, torch.ones_like(tokens))


class FakeTarget:
    """Writes each sample's id into its row of the slot; checks the slot was consumed first."""

    def __init__(self, *, rank: int, num_slots: int) -> None:
        self.rank, self.ring = rank, None
        self.reset(num_slots)

    def reset(self, num_slots: int) -> None:
        """A new ring of ``num_slots`` (every reader closed the old one first)."""
        self.close()
        self.ring = SlotRing(self.rank, num_slots, MAX_ROWS * WIDTH, torch.float32, "cpu")
        self.ring.buffer.fill_(CONSUMED)
        self.num_slots = num_slots
        self.most_unconsumed = 0

    def ring_handle(self) -> RingHandle:
        return self.ring.handle()

    def produce(self, slot: int, batch: MicroBatch) -> SlotReady:
        slots = self.ring.buffer.view(self.num_slots, -1)
        unconsumed = int((slots[:, 0] != CONSUMED).sum())
        self.most_unconsumed = max(self.most_unconsumed, unconsumed)
        assert slots[slot, 0] == CONSUMED, f"slot {slot} reused before a drafter copied it"
        shape = batch.meta.shape
        self.ring.slot(slot, shape).copy_(batch.input_ids.float())
        ready = self.ring.publish(slot, shape, batch.meta.sample_ids)
        meta = ProduceMeta(step=batch.meta.step, index=batch.meta.index, start_s=0.0,
                           busy_s=0.0, on_main_thread=True)
        return SlotReady(ready.target_rank, ready.slot, ready.shape, ready.sample_ids, meta)

    def unconsumed_high_water(self) -> int:
        return self.most_unconsumed

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None


class FakeDrafter:
    def __init__(self, *, rank: int, gate: Optional[str]) -> None:
        self.rank, self.reader = rank, None
        self.reset(gate)

    def reset(self, gate: Optional[str]) -> None:
        """Detached from every ring, nothing loaded or trained."""
        self.close()
        self.gate = Path(gate) if gate else None
        self.reader = RingReader("cpu")
        self.buffer = torch.empty(MAX_ROWS * WIDTH)
        self.loaded: Optional[SlotReady] = None
        self.trained: dict[int, list[tuple[int, ...]]] = {}

    def attach(self, handles: list[RingHandle]) -> None:
        for handle in handles:
            self.reader.attach(handle)

    def load(self, ready: SlotReady) -> SlotAck:
        ack = self.reader.copy_out(ready, self.buffer)
        self.reader.view(ready).fill_(CONSUMED)
        self.loaded = ready
        return ack

    def forward_backward(self, batch: MicroBatch) -> MicroResult:
        ready, self.loaded = self.loaded, None
        rows = self.buffer[:len(batch.meta.sample_ids) * WIDTH].view(-1, WIDTH)
        assert torch.equal(rows, batch.input_ids.float()), (
            f"drafter {self.rank}: slot {ready.slot} held {rows[:, 0].tolist()}, "
            f"batch {batch.meta.sample_ids}")
        self.trained.setdefault(batch.meta.step, []).append(batch.meta.sample_ids)
        return MicroResult(drafter=self.rank, step=batch.meta.step, epoch=0,
                           sample_ids=batch.meta.sample_ids, numerator=1.0, denominator=1.0,
                           correct=(), total=(), tokens=0, start_s=0.0, busy_s=0.0,
                           on_main_thread=True)

    def step(self, step: int) -> StepResult:
        if self.gate is not None and self.rank == 1 and step == 1:
            self.gate.touch()
        if self.gate is not None and self.rank == 0 and step == 0:
            deadline = time.monotonic() + 120
            while not self.gate.exists():  # drafter 1 finishes step 1 first
                assert time.monotonic() < deadline, "drafter 1 never finished step 1"
                time.sleep(0.01)
        samples = sum(len(ids) for ids in self.trained.pop(step, []))
        return StepResult(drafter=self.rank, step=step, denominator=float(samples),
                          grad_norm=0.0, skipped=False, lr=0.0, start_s=0.0, busy_s=0.0,
                          reduce_start_s=0.0,
                          reduce_s=0.0, max_memory_bytes=0, param_checksum=0.0,
                          on_main_thread=True, cudagraph_skips=0)

    def echo(self, value: int) -> int:
        return value

    def fail(self) -> None:
        raise ValueError("an after-step call failed")

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None


class Gated:
    """Answers once its gate file exists, so a call finishes late by construction (after a
    minute it answers anyway, saying so, and the test fails on that answer)."""

    def __init__(self, *, gate: Optional[str]) -> None:
        self.gate = Path(gate) if gate else None

    def echo(self, value: int) -> object:
        deadline = time.monotonic() + 60
        while self.gate is not None and not self.gate.exists():
            if time.monotonic() > deadline:
                return "the gate never opened: a lane waited for another"
            time.sleep(0.01)
        return value


@pytest.fixture(scope="module")
def fake_actors(ray_session):
    """One set of fake actors for the module (each is a process that imports torch); every
    test resets them to its own plan, ring and gate."""
    where = Placement(cpus=0.1)
    prefetcher = start_actor(FakePrefetcher, where, steps=[])
    target = start_actor(FakeTarget, where, rank=0, num_slots=1)
    drafters = [start_actor(FakeDrafter, where, rank=d, gate=None) for d in range(2)]
    try:
        ray.get(target.ring_handle.remote(), timeout=180)
    except ray.exceptions.GetTimeoutError:  # a failure that says what the cluster holds
        pytest.fail(f"the fake actors never started: free {ray.available_resources()} "
                    f"of {ray.cluster_resources()}")
    yield prefetcher, target, drafters
    # Readers before the ring's owner, as ActorGroup.close does.
    ray.get([d.close.remote() for d in drafters])
    ray.get(target.close.remote())
    kill_actors([prefetcher, target, *drafters])


@pytest.fixture()
def fakes(fake_actors, tmp_path):
    prefetcher, target, drafters = fake_actors

    def make(steps, num_slots: int, gate: bool = False):
        ray.get([d.reset.remote(str(tmp_path / "gate") if gate else None) for d in drafters])
        ray.get([target.reset.remote(num_slots), prefetcher.reset.remote(steps)])
        handle = ray.get(target.ring_handle.remote())
        ray.get([d.attach.remote([handle]) for d in drafters])
        return Topology(prefetcher, [target], drafters, [0], [0, 0], num_slots)

    return make


def test_steps_close_in_order_when_results_arrive_out_of_order(fakes, tmp_path):
    steps = plan(num_steps=4, per_step=4)
    topo = fakes(steps, num_slots=3, gate=True)
    reports: list[StepReport] = []
    done_after: list[int] = []

    def after_step(step: int) -> list[AfterStepCall]:
        return [AfterStepCall(topo.drafters[0].echo.remote(step), done_after.append)]

    StepLoop(topo, end_step=4, on_step=reports.append, after_step=after_step).run()

    assert (tmp_path / "gate").exists(), "drafter 1 did not finish step 1 before step 0 closed"
    assert [r.step for r in reports] == [0, 1, 2, 3]
    for report, planned in zip(reports, steps):
        assert sorted(m.sample_ids for m in report.micro) == sorted(planned)
        assert {m.step for m in report.micro} == {report.step}
        assert sorted(r.drafter for r in report.results) == [0, 1]
        assert {r.step for r in report.results} == {report.step}
        # Each drafter stepped over exactly the micro-batches it trained in this step.
        assert sum(r.denominator for r in report.results) == 2 * len(planned)
        assert len(report.produced) == len(report.slot_waits) == len(planned)
    # Queued in one lane: handed over in step order, all of them before run returns.
    assert done_after == [0, 1, 2, 3]


def test_after_step_handlers_keep_their_lane_order_and_lanes_do_not_wait(fakes, tmp_path):
    """Lane "slow": step 0's call finishes only once lane "free" handled step 2, step 1's at
    once; its handlers still run 0 then 1. Were lanes one queue, the gate would never open."""
    topo = fakes(plan(num_steps=3, per_step=2), num_slots=2)
    gate = tmp_path / "lane_gate"
    slow = start_actor(Gated, Placement(cpus=0.1), gate=str(gate))
    events: list[tuple[str, object]] = []

    def free_done(step: int) -> None:
        events.append(("free", step))
        if step == 2:
            gate.touch()

    def after_step(step: int) -> list[AfterStepCall]:
        calls = [AfterStepCall(topo.drafters[1].echo.remote(step), free_done, lane="free")]
        if step < 2:
            actor = slow if step == 0 else topo.drafters[0]
            calls.append(AfterStepCall(actor.echo.remote(step),
                                       lambda value: events.append(("slow", value)),
                                       lane="slow"))
        return calls

    try:
        StepLoop(topo, end_step=3, after_step=after_step).run()
    finally:
        kill_actors([slow])
    assert events == [("free", 0), ("free", 1), ("free", 2), ("slow", 0), ("slow", 1)]


def test_a_failed_after_step_call_with_on_error_costs_only_itself(fakes):
    dead = start_actor(Gated, Placement(cpus=0.1), gate=None)
    ray.get(dead.echo.remote(0))
    ray.kill(dead)
    topo = fakes(plan(num_steps=2, per_step=2), num_slots=2)
    done, errors = [], []

    def guarded(step: int) -> list[AfterStepCall]:
        ref = topo.drafters[0].fail.remote() if step == 0 else dead.echo.remote(step)
        return [AfterStepCall(ref, done.append, on_error=errors.append, lane="guarded")]

    reports: list[StepReport] = []
    loop = StepLoop(topo, end_step=2, on_step=reports.append, after_step=guarded)
    loop.run()
    assert [r.step for r in reports] == [0, 1] and done == []
    assert len(errors) == 2 and isinstance(errors[0], RayTaskError)
    assert "an after-step call failed" in str(errors[0])
    assert isinstance(errors[1], RayActorError)  # the call's actor died
    # Without on_error the same failure raises out of the loop: the driver's recovery decides.
    ref = dead.echo.remote(2)
    loop._track(AfterStepCall(ref, done.append))
    with pytest.raises(RayActorError):
        loop._complete(ref)


def test_a_full_ring_holds_back_the_target(fakes):
    steps = plan(num_steps=3, per_step=4)
    topo = fakes(steps, num_slots=1)
    reports: list[StepReport] = []
    StepLoop(topo, end_step=3, on_step=reports.append).run()
    assert [r.step for r in reports] == [0, 1, 2]
    # With one slot, every write found the ring empty: nothing was written ahead of a copy.
    assert ray.get(topo.targets[0].unconsumed_high_water.remote()) == 0


def test_a_plan_that_ends_early_stalls_with_a_clear_error(fakes):
    topo = fakes(plan(num_steps=2, per_step=2), num_slots=2)
    reports: list[StepReport] = []
    with pytest.raises(RuntimeError, match="step loop stalled at step 2: nothing in flight"):
        StepLoop(topo, end_step=3, on_step=reports.append).run()
    assert [r.step for r in reports] == [0, 1]
