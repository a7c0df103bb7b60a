"""The driver's step loop: micro-batches to targets, ready slots to drafters, step boundaries.

The loop only moves small messages. It keeps each target's ring full (a micro-batch goes to a
target only when the ledger gives a free slot: backpressure), hands every ready slot to the
least-busy drafter of the same node, and, once the last micro-batch of step s has been handed
out, tells every drafter to take step s. Drafters are plain actors that run calls in order, so
step s's update always lands after its micro-batches and before step s+1's.

Calls the driver queues behind a step (a checkpoint save, a tau evaluation) are handed to
their handlers in the order they were queued within their lane, whatever order ``ray.wait``
reports them in (of several finished refs it may report a later one first). Calls of one
lane run on one actor, which finishes them in that order anyway, so the order costs no
waiting; separate lanes keep a slow evaluation from holding back a checkpoint. A call with an
``on_error`` handler owns its failures: a dead evaluator costs that evaluation, never the
step loop.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import ray
from ray.exceptions import RayError

from pipeline.driver.drafter_group import OWNER_LANE
from pipeline.driver.staged import produce_chain
from pipeline.transport.ledger import SlotLedger
from pipeline.transport.messages import SlotReady
from pipeline.workers.messages import MicroBatchMeta, MicroResult, StepResult

log = logging.getLogger(__name__)


@dataclass
class Topology:
    prefetcher: Any
    targets: list[Any]
    drafters: list[Any]
    target_node: list[int]  # node index of each target
    drafter_node: list[int]  # node index of each drafter
    num_slots: int
    # Each target's actors, stage 0 first ([target] unstaged); None: the targets themselves.
    chains: Optional[list[list[Any]]] = None

    def produce(self, target: int, slot: int, batch_ref: Any) -> Any:
        """The ref of target ``target``'s SlotReady for ``batch_ref`` in ``slot``."""
        chain = self.chains[target] if self.chains else [self.targets[target]]
        return produce_chain(chain, slot, batch_ref)


@dataclass(frozen=True)
class SlotWait:
    """A ready slot waiting for a drafter to take it (wall clock, for the trace)."""

    target: int
    ready_at: float
    taken_at: float


# The lane of after-step calls that name none: the drafters' owner rank (checkpoint saves).
DEFAULT_LANE = OWNER_LANE


@dataclass(frozen=True)
class AfterStepCall:
    """A call the driver queued right behind a step (a checkpoint save on the drafters, a tau
    evaluation), and what to do with its result once it is done.

    Handlers of one ``lane`` run in the order the calls were queued: give calls that one actor
    runs the same lane. Without ``on_error`` a failed call raises out of the step loop (the
    driver's recovery then looks for the lost actor); with it, the error goes to ``on_error``
    and the loop goes on.
    """

    ref: Any  # ray.ObjectRef
    on_done: Callable[[Any], None]
    on_error: Optional[Callable[[RayError], None]] = None
    lane: str = DEFAULT_LANE


@dataclass
class _Queued:
    """An after-step call in its lane; ``done`` once its outcome is in, until handed over."""

    call: AfterStepCall
    done: bool = False
    value: Any = None
    error: Optional[RayError] = None

    def hand_over(self) -> None:
        if self.error is not None:
            assert self.call.on_error is not None, "an unguarded error is raised at once"
            self.call.on_error(self.error)
        else:
            self.call.on_done(self.value)


@dataclass
class _Prefetched:
    """A prefetch call, in the plan order it was made: its batch, and its meta once it came
    back (None then means the plan is exhausted)."""

    batch_ref: Any
    meta: Optional[MicroBatchMeta] = None
    arrived: bool = False


@dataclass
class StepReport:
    """Everything the driver learnt about one optimizer step."""

    step: int
    epoch: int
    micro: list[MicroResult]
    results: list[StepResult]
    produce_busy_s: dict[int, float]
    produced: list[SlotReady]  # one per micro-batch, with the target's span in .meta
    slot_waits: list[SlotWait]
    wall_s: float
    slot_wait_s: float
    ready_depth: float


@dataclass
class _StepState:
    dispatched: int = 0
    num_micro: int = -1  # known once its first micro-batch is handed out
    micro: list[MicroResult] = field(default_factory=list)
    results: list[StepResult] = field(default_factory=list)
    produce_busy: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    produced: list[SlotReady] = field(default_factory=list)
    slot_waits: list[SlotWait] = field(default_factory=list)
    slot_wait_s: float = 0.0
    depth_samples: list[int] = field(default_factory=list)


# What to do with a finished ref's value: each pending ref carries its own bound handler.
# An after-step call waits as a _Queued entry instead: its handler may have to wait its turn.
Handler = Callable[[Any], None]


class StepLoop:
    def __init__(self, topo: Topology, end_step: int, first_step: int = 0,
                 on_step: Optional[Callable[[StepReport], None]] = None,
                 after_step: Optional[Callable[[int], list[AfterStepCall]]] = None,
                 max_queued_per_drafter: int = 2,
                 start_calls: Sequence[AfterStepCall] = ()) -> None:
        """``after_step(step)`` returns the calls the driver queued behind step ``step``; the
        loop runs until those are done too. ``start_calls`` were queued before the first step
        (tau before training, beside it) and are collected the same way."""
        self.t = topo
        self.num_steps = end_step
        self.after_step = after_step
        self.next_step_to_close = first_step
        self.dispatch_step = first_step
        self.on_step = on_step or (lambda report: None)
        self.max_queued = max_queued_per_drafter
        nodes = sorted(set(topo.target_node))
        self.ledgers = {n: SlotLedger({t: topo.num_slots for t, tn in enumerate(topo.target_node)
                                       if tn == n}) for n in nodes}
        self.waiting: deque[tuple[MicroBatchMeta, Any]] = deque()
        self.batch_of: dict[tuple[int, int], tuple[MicroBatchMeta, Any]] = {}
        self.ready_since: dict[tuple[int, int], float] = {}
        # Refs whose failure ends the loop (the driver's recovery scans them for a lost actor).
        self.pending: dict[Any, Handler | _Queued] = {}
        # After-step calls that handle their own failures (their actor is not the loop's).
        self.guarded: dict[Any, _Queued] = {}
        self.lanes: dict[str, deque[_Queued]] = defaultdict(deque)
        self.queued = [0] * len(topo.drafters)
        self.steps: dict[int, _StepState] = defaultdict(_StepState)
        self.exhausted = False
        # Prefetch calls in the order they were made: micro-batches join ``waiting`` in it.
        self.prefetched: deque[_Prefetched] = deque()
        self.after_step_in_flight = 0
        self.prefetch_depth = len(topo.targets) * topo.num_slots + len(topo.drafters)
        self.step_started = time.perf_counter()
        for call in start_calls:
            self._track(call)

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        while self.next_step_to_close < self.num_steps or self.after_step_in_flight:
            self._prefetch()
            self._feed_targets()
            self._feed_drafters()
            if not self.pending and not self.guarded:
                raise RuntimeError(f"step loop stalled at step {self.next_step_to_close}: "
                                   "nothing in flight and the step is not complete")
            done, _ = ray.wait([*self.pending, *self.guarded], num_returns=1)
            for ref in done:
                self._complete(ref)

    def _complete(self, ref: Any) -> None:
        if ref in self.guarded:
            self._on_after_step(self.guarded.pop(ref), ref)
            return
        waiter = self.pending.pop(ref)
        if isinstance(waiter, _Queued):
            self._on_after_step(waiter, ref)
        else:
            waiter(ray.get(ref))

    def _prefetch(self) -> None:
        while (not self.exhausted and
               len(self.waiting) + len(self.prefetched) < self.prefetch_depth):
            meta_ref, batch_ref = self.t.prefetcher.next_micro_batch.options(
                num_returns=2).remote()
            entry = _Prefetched(batch_ref)
            self.prefetched.append(entry)
            self.pending[meta_ref] = functools.partial(self._on_batch, entry)

    def _feed_targets(self) -> None:
        while self.waiting:
            target = self._free_target()
            if target is None:
                return
            meta, batch_ref = self.waiting.popleft()
            node = self.t.target_node[target]
            slot = self.ledgers[node].acquire(target)
            self.batch_of[(target, slot)] = (meta, batch_ref)
            ref = self.t.produce(target, slot, batch_ref)
            self.pending[ref] = functools.partial(self._on_produced, node)

    def _free_target(self) -> Optional[int]:
        """The target with the most free slots, or None when every ring is full."""
        best, best_free = None, 0
        for target, node in enumerate(self.t.target_node):
            free = self.t.num_slots - self.ledgers[node].in_flight_of(target)
            if free > best_free:
                best, best_free = target, free
        return best

    def _feed_drafters(self) -> None:
        for node, ledger in self.ledgers.items():
            while self.dispatch_step < self.num_steps:
                state = self.steps[self.dispatch_step]
                drafter = self._idle_drafter(node)
                if drafter is None:
                    break
                ready = ledger.take_ready(lambda r: r.meta.step == self.dispatch_step)
                if ready is None:
                    break
                key = (ready.target_rank, ready.slot)
                meta, batch_ref = self.batch_of.pop(key)
                wait = SlotWait(ready.target_rank, self.ready_since.pop(key), time.time())
                state.slot_wait_s += wait.taken_at - wait.ready_at
                state.slot_waits.append(wait)
                state.depth_samples.append(ledger.num_ready + 1)
                handle = self.t.drafters[drafter]
                self.pending[handle.load.remote(ready)] = ledger.release
                self.pending[handle.forward_backward.remote(batch_ref)] = functools.partial(
                    self._on_micro, drafter)
                self.queued[drafter] += 1
                state.dispatched += 1
                state.num_micro = meta.num_in_step
                if state.dispatched == meta.num_in_step:
                    self._close_dispatch(self.dispatch_step)

    def _idle_drafter(self, node: int) -> Optional[int]:
        options = [(self.queued[d], d) for d, n in enumerate(self.t.drafter_node)
                   if n == node and self.queued[d] < self.max_queued]
        return min(options)[1] if options else None

    def _close_dispatch(self, step: int) -> None:
        """Every micro-batch of ``step`` is handed out: the step boundary goes to all drafters."""
        for handle in self.t.drafters:
            self.pending[handle.step.remote(step)] = self._on_step_result
        for call in (self.after_step(step) if self.after_step else []):
            self._track(call)
        self.dispatch_step += 1

    # -- completions: one bound handler per kind of call ------------------------------------
    def _on_batch(self, entry: _Prefetched, meta: Optional[MicroBatchMeta]) -> None:
        """Micro-batches reach the targets in plan order, whatever order ``ray.wait`` reports
        the prefetcher's answers in: a later step's batch taking the ring's slots ahead of an
        earlier step's one could fill the ring with slots no drafter may take yet (a stall)."""
        entry.meta, entry.arrived = meta, True
        while self.prefetched and self.prefetched[0].arrived:
            head = self.prefetched.popleft()
            if head.meta is None:
                self.exhausted = True
            else:
                self.waiting.append((head.meta, head.batch_ref))

    def _on_produced(self, node: int, ready: SlotReady) -> None:
        assert ready.meta is not None, f"target {ready.target_rank} sent a slot without meta"
        self.ledgers[node].mark_ready(ready)
        self.ready_since[(ready.target_rank, ready.slot)] = time.time()
        state = self.steps[ready.meta.step]
        state.produce_busy[ready.target_rank] += ready.meta.busy_s
        state.produced.append(ready)

    def _on_micro(self, drafter: int, result: MicroResult) -> None:
        self.queued[drafter] -= 1
        self.steps[result.step].micro.append(result)
        self._close_completed()

    def _on_step_result(self, result: StepResult) -> None:
        self.steps[result.step].results.append(result)
        self._close_completed()

    def _track(self, call: AfterStepCall) -> None:
        queued = _Queued(call)
        (self.pending if call.on_error is None else self.guarded)[call.ref] = queued
        self.lanes[call.lane].append(queued)
        self.after_step_in_flight += 1

    def _on_after_step(self, queued: _Queued, ref: Any) -> None:
        """Keep the outcome, then hand over every finished call at the head of its lane."""
        try:
            queued.value = ray.get(ref)
        except RayError as exc:
            if queued.call.on_error is None:
                raise
            queued.error = exc
        queued.done = True
        lane = self.lanes[queued.call.lane]
        while lane and lane[0].done:
            self.after_step_in_flight -= 1
            lane.popleft().hand_over()

    def _close_completed(self) -> None:
        """Report completed steps in order (results of step s+1 may be seen before s's)."""
        while self.next_step_to_close < self.num_steps:
            step = self.next_step_to_close
            state = self.steps[step]
            if len(state.results) < len(self.t.drafters) or len(state.micro) < state.num_micro:
                return
            self._close(step, state)

    def _close(self, step: int, state: _StepState) -> None:
        now = time.perf_counter()
        depth = state.depth_samples
        self.on_step(StepReport(
            step=step, epoch=state.micro[0].epoch if state.micro else -1, micro=state.micro,
            results=state.results, produce_busy_s=dict(state.produce_busy),
            produced=state.produced, slot_waits=state.slot_waits,
            wall_s=now - self.step_started, slot_wait_s=state.slot_wait_s,
            ready_depth=sum(depth) / len(depth) if depth else 0.0))
        self.step_started = now
        del self.steps[step]
        self.next_step_to_close += 1
