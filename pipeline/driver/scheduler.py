"""The driver's step loop: micro-batches to targets, ready slots to drafters, step boundaries.

The loop only moves small messages. It keeps each target's ring full (a micro-batch goes to a
target only when the ledger gives a free slot: backpressure), hands every ready slot to the
least-busy drafter of the same node, and, once the last micro-batch of step s has been handed
out, tells every drafter to take step s. Drafters are plain actors that run calls in order, so
step s's update always lands after its micro-batches and before step s+1's.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import ray

from pipeline.transport.ledger import SlotLedger
from pipeline.transport.messages import SlotAck, SlotReady
from pipeline.workers.messages import MicroBatchMeta, MicroResult, ProduceMeta, StepResult

log = logging.getLogger(__name__)


@dataclass
class Topology:
    prefetcher: Any
    targets: list[Any]
    drafters: list[Any]
    target_node: list[int]
    drafter_node: list[int]
    num_slots: int


@dataclass
class StepReport:
    """Everything the driver learnt about one optimizer step."""

    step: int
    epoch: int
    micro: list[MicroResult]
    results: list[StepResult]
    produce_busy_s: dict[int, float]
    produced: list[tuple[int, ProduceMeta]]     # (target, its span) per micro-batch
    slot_waits: list[tuple[int, float, float]]  # (target, ready at, taken at), wall clock
    wall_s: float
    slot_wait_s: float
    ready_depth: float


@dataclass
class _Pending:
    kind: str  # "batch" | "produce" | "ack" | "micro" | "step" | "extra"
    info: Any = None


@dataclass
class _StepState:
    dispatched: int = 0
    num_micro: int = -1  # known once its first micro-batch is handed out
    micro: list[MicroResult] = field(default_factory=list)
    results: list[StepResult] = field(default_factory=list)
    produce_busy: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    produced: list = field(default_factory=list)
    slot_waits: list = field(default_factory=list)
    slot_wait_s: float = 0.0
    depth_samples: list[int] = field(default_factory=list)


class StepLoop:
    def __init__(self, topo: Topology, end_step: int, first_step: int = 0,
                 on_step: Optional[Callable[[StepReport], None]] = None,
                 after_step_call: Optional[Callable[[int], list[tuple[Any, Callable]]]] = None,
                 max_queued_per_drafter: int = 2) -> None:
        """``after_step_call(step)`` returns (ref, callback) pairs: calls the driver queued on a
        drafter right behind step ``step`` (a checkpoint save, a tau evaluation), and what to
        do once each is done.
        """
        self.t = topo
        self.num_steps = end_step
        self.after_step_call = after_step_call
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
        self.pending: dict[Any, _Pending] = {}
        self.queued = [0] * len(topo.drafters)
        self.steps: dict[int, _StepState] = defaultdict(_StepState)
        self.exhausted = False
        self.prefetch_in_flight = 0
        self.prefetch_depth = len(topo.targets) * topo.num_slots + len(topo.drafters)
        self.step_started = time.perf_counter()

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        while self.next_step_to_close < self.num_steps or self._extra_pending():
            self._prefetch()
            self._feed_targets()
            self._feed_drafters()
            if not self.pending:
                raise RuntimeError(f"step loop stalled at step {self.next_step_to_close}: "
                                   "nothing in flight and the step is not complete")
            done, _ = ray.wait(list(self.pending), num_returns=1)
            for ref in done:
                self._complete(ref, self.pending.pop(ref))

    def _extra_pending(self) -> bool:
        return any(p.kind == "extra" for p in self.pending.values())

    def _prefetch(self) -> None:
        while (not self.exhausted and
               len(self.waiting) + self.prefetch_in_flight < self.prefetch_depth):
            meta_ref, batch_ref = self.t.prefetcher.next_micro_batch.options(
                num_returns=2).remote()
            self.pending[meta_ref] = _Pending("batch", batch_ref)
            self.prefetch_in_flight += 1

    def _feed_targets(self) -> None:
        while self.waiting:
            target = self._free_target()
            if target is None:
                return
            meta, batch_ref = self.waiting.popleft()
            slot = self.ledgers[self.t.target_node[target]].acquire(target)
            self.batch_of[(target, slot)] = (meta, batch_ref)
            ref = self.t.targets[target].produce.remote(slot, batch_ref)
            self.pending[ref] = _Pending("produce", target)

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
                ready_at = self.ready_since.pop(key)
                state.slot_wait_s += time.time() - ready_at
                state.slot_waits.append((ready.target_rank, ready_at, time.time()))
                state.depth_samples.append(ledger.num_ready + 1)
                handle = self.t.drafters[drafter]
                self.pending[handle.load.remote(ready)] = _Pending("ack", node)
                self.pending[handle.forward_backward.remote(batch_ref)] = _Pending("micro",
                                                                                  drafter)
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
            self.pending[handle.step.remote(step)] = _Pending("step", step)
        for ref, callback in (self.after_step_call(step) if self.after_step_call else []):
            self.pending[ref] = _Pending("extra", callback)
        self.dispatch_step += 1

    # -- completions ------------------------------------------------------------------------
    def _complete(self, ref: Any, p: _Pending) -> None:
        value = ray.get(ref)
        if p.kind == "batch":
            self.prefetch_in_flight -= 1
            if value is None:
                self.exhausted = True
            else:
                self.waiting.append((value, p.info))
        elif p.kind == "produce":
            ready: SlotReady = value
            self.ledgers[self.t.target_node[p.info]].mark_ready(ready)
            self.ready_since[(ready.target_rank, ready.slot)] = time.time()
            state = self.steps[ready.meta.step]
            state.produce_busy[ready.target_rank] += ready.meta.busy_s
            state.produced.append((ready.target_rank, ready.meta))
        elif p.kind == "ack":
            ack: SlotAck = value
            self.ledgers[p.info].release(ack)
        elif p.kind == "micro":
            self.queued[p.info] -= 1
            self.steps[value.step].micro.append(value)
            self._close_completed()
        elif p.kind == "step":
            self.steps[p.info].results.append(value)
            self._close_completed()
        elif p.kind == "extra":
            p.info(value)

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
