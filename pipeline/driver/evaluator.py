"""The driver's side of tau evaluation: one evaluator actor, fed weights behind steps.

An evaluation due after step s is two calls: ``weights`` on the drafters (their owner rank
today: pipeline/driver/drafter_group.py), queued behind step s (so it copies exactly the weights
after s, and costs a copy, not an evaluation), and ``evaluate`` on the evaluator with that ref. Ray moves the weights through the object store
to the evaluator, which runs while the drafters train on; the step loop collects the result
whenever it lands and it is logged at step s. Before and after training the driver simply
waits for the result (nothing else is running then).

The evaluator is not part of the training set: when it dies, the evaluation it took with it
is reported as failed (a warning naming the tau evaluator), a new one is started without
waiting for it, and training goes on. It is replaced at most ``train.recovery.max_restarts``
times, counted apart from the training set's restarts; after that tau is no longer evaluated.
Every failed evaluation, whatever the cause, is counted by the driver (eval_tally.py): a job
whose every evaluation failed ends with exit code 1 once training and export are done.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Optional

import ray
import torch
from ray.exceptions import RayActorError, RayError, RayTaskError

from pipeline.runtime import stop_signals
from pipeline.job.config import JobConfig, weights_ring
from pipeline.driver.drafter_group import DrafterGroup
from pipeline.driver.placement import NotPlaced
from pipeline.driver.scheduler import AfterStepCall
from pipeline.runtime.actor_pool import release_actors
from pipeline.runtime.ray_start import Placement, kill_actors, start_actor
from pipeline.job.resolve import ResolvedJob
from pipeline.workers.eval_worker import EvalResult, EvalWorker

log = logging.getLogger(__name__)

# How long the evaluator may take to be placed and built before the job stops with advice.
_PLACE_TIMEOUT_S = 300.0
# How long a stopped job (Ctrl-C, SIGTERM) lets the evaluator close: it closes behind the
# evaluation it is running, whose result nobody will read.
_STOPPED_CLOSE_S = 5.0
# The step loop's lane for evaluations: one actor runs them in order (see AfterStepCall).
LANE = "tau evaluator"
_UNKNOWN = object()  # the evaluator's node, until its answer is in


class TauEvaluator:
    """Context-managed: the actor starts on entry (when eval is on) and is killed on exit."""

    def __init__(self, job: JobConfig, resolved: ResolvedJob,
                 prompts: Callable[[], list[list[int]]], worker: type = EvalWorker) -> None:
        self.job = job
        self.r = resolved
        self._prompts = prompts
        self.worker = worker  # the actor's class (fault-injection tests give a subclass)
        self.actor: Any = None
        self.in_flight = 0  # evaluations sent behind steps and not yet back
        self.restarts = 0  # evaluators started again after one died
        # Drafter rank 0's weights snapshot ring (pipeline/workers/weights.py) has one slot:
        # an evaluation that was handed it holds it until its result is back; meanwhile the
        # next one takes the object store.
        self.ring = weights_ring(job)
        self.ring_held = False
        self._node_ref: Any = None
        self._node: Any = _UNKNOWN

    @property
    def enabled(self) -> bool:
        return self.job.train.eval.off is None

    def __enter__(self) -> "TauEvaluator":
        """Launch only: the evaluator builds while the training actors start beside it;
        :meth:`wait_ready` then checks that it came up."""
        if self.enabled:
            self._launch()
        return self

    def __exit__(self, exc_type: Optional[type], *exc: Any) -> None:
        # A stopped job has no use for an evaluation in flight: a short wait, then the kill.
        self.close(60.0 if stop_signals.grace_for(exc_type) is None else _STOPPED_CLOSE_S)

    def start(self) -> None:
        """Start the evaluator and wait until it is built."""
        self._launch()
        self.wait_ready()

    def wait_ready(self) -> None:
        """A job that has no room for the evaluator, or cannot build it, stops here with
        advice, before any training."""
        if self.actor is None:
            return
        e = self.job.train.eval
        ready, _ = ray.wait([self.actor.__ray_ready__.remote()], timeout=_PLACE_TIMEOUT_S)
        if ready:
            ray.get(ready[0])  # a failed constructor raises here, not at the first evaluation
            self._node = ray.get(self._node_ref)  # so the first evaluation may take the ring
        else:  # one line, as any wait for room (driver/placement.py)
            raise NotPlaced(
                f"the tau evaluator (train.eval.gpus={e.gpus:g} GPU, "
                f"cluster.cpus_per_actor={self.job.cluster.cpus_per_actor:g} CPU) found no room "
                f"in {_PLACE_TIMEOUT_S:.0f}s beside the training actors: lower "
                f"cluster.gpus_per_actor so each GPU keeps train.eval.gpus free, or turn eval "
                f"off (train.eval.every=-1)")

    def _launch(self) -> None:
        e, r = self.job.train.eval, self.r
        gpus = e.gpus if r.device == "cuda" else 0.0
        self.actor = start_actor(
            self.worker, Placement(cpus=self.job.cluster.cpus_per_actor, gpus=gpus),
            spec=r.spec, target_path=r.target_path, device=r.device,
            target_dtype=r.autocast_dtype or torch.float32, prompts=self._prompts(),
            max_new_tokens=e.max_new_tokens, eos_token_id=r.eos_token_id,
            decode=e.decode_options())
        self._node_ref, self._node = self.actor.node_id.remote(), _UNKNOWN

    def close(self, timeout_s: float = 60.0) -> None:
        if self.actor is None:
            return
        try:
            ray.get(self.actor.close.remote(), timeout=timeout_s)
            release_actors([self.actor])  # kept for a next job where actors are kept
        except Exception as exc:  # a dead evaluator must not hide the original error
            log.warning("closing the tau evaluator failed: %s", exc)
            kill_actors([self.actor])
        self.actor = None

    def result_ref(self, drafters: DrafterGroup, step: int) -> tuple[Any, bool]:
        """ObjectRef of an :class:`EvalResult` for the drafters' weights as of now in their
        queues (behind every call already sent to them), and whether it was let use the
        snapshot ring (then it holds it: :meth:`_returned` lets go)."""
        assert self.actor is not None, "the tau evaluator is not started"
        ring, node = self._ring_args()
        self.ring_held = self.ring_held or ring is not False
        return self.actor.evaluate.remote(drafters.weights_ref(ring, node), step), ring is not False

    def _ring_args(self) -> tuple[Optional[bool], Optional[str]]:
        """``(ring, reader_node)`` for drafter rank 0's ``weights``: the object store while
        the slot is held, or while the evaluator's node is not known and the setting is null."""
        if self.ring is False or self.ring_held:
            return False, None
        if self._node is _UNKNOWN and self._node_ref is not None:
            ready, _ = ray.wait([self._node_ref], timeout=0)
            if ready:
                try:
                    self._node = ray.get(ready[0])
                except RayError:  # a dead evaluator: its evaluation fails on its own
                    self._node = None
        if self._node is _UNKNOWN:
            return (False, None) if self.ring is None else (True, None)
        return self.ring, self._node

    def forget_in_flight(self) -> None:
        """After the training set was restarted: the evaluations sent behind its steps are not
        collected again, and the ring they held was the dead drafter's (its successor makes a
        new one, which the evaluator opens in its place)."""
        self.in_flight, self.ring_held = 0, False

    def _returned(self, used_ring: bool) -> None:
        if used_ring:
            self.ring_held = False

    def evaluate(self, drafters: DrafterGroup, step: int) -> Optional[EvalResult]:
        """Evaluate now and wait (before or after training); None when eval is off. An
        evaluator found dead here is replaced and asked once more: nothing else runs now."""
        if not self.enabled:
            return None
        actor = self.actor
        result = self._wait(actor, drafters, step)
        if self.actor is not None and self.actor is not actor:
            result = self._wait(self.actor, drafters, step)
        return result

    def _wait(self, actor: Any, drafters: DrafterGroup, step: int) -> EvalResult:
        if actor is None:
            return self._gone(step)
        ref, used_ring = self.result_ref(drafters, step)
        try:
            return ray.get(ref)
        except RayError as error:
            return self._lost(actor, step, error)
        finally:
            self._returned(used_ring)

    def behind_step(self, drafters: DrafterGroup, step: int,
                    on_done: Callable[[EvalResult], None]) -> AfterStepCall:
        """The evaluation of the weights after ``step`` steps, for the step loop to collect."""
        self.in_flight += 1
        if self.in_flight > 1:  # each queued one holds a copy of the weights in the store
            log.warning("tau evaluations fall behind training: %d queued (the one after step "
                        "%d included); raise train.eval.every or lower train.eval.prompts",
                        self.in_flight, step)

        actor = self.actor
        if actor is None:  # no evaluator left: the figure is reported as failed at once
            ref, used_ring = ray.put(self._gone(step)), False
        else:
            ref, used_ring = self.result_ref(drafters, step)

        def done(result: EvalResult) -> None:
            self.in_flight -= 1
            self._returned(used_ring)
            on_done(result)

        def failed(error: RayError) -> None:
            done(self._lost(actor, step, error))
        return AfterStepCall(ref, done, on_error=None if actor is None else failed, lane=LANE)

    # -- a dead evaluator -------------------------------------------------------------------
    def _lost(self, actor: Any, step: int, error: RayError) -> EvalResult:
        """The failed result of an evaluation Ray could not run; replaces a dead evaluator.

        ``actor`` is the evaluator the call went to: calls still in flight on one already
        replaced fail too, and must not start another.
        """
        if not _died(error, actor):  # e.g. drafter rank 0, whose weights it needed, died
            return _failed(step, "the tau evaluation failed in Ray (in the evaluator, or in "
                                 f"drafter rank 0 handing it the weights): {_first_line(error)}")
        if actor is self.actor:
            self._replace(step)
        return _failed(step, f"the tau evaluator died ({_first_line(error)}); "
                             f"{'a new one is starting' if self.actor else 'none is left'}")

    def _replace(self, step: int) -> None:
        limit = self.job.train.recovery.max_restarts
        kill_actors([self.actor])
        self.actor = None
        if self.restarts >= limit:
            log.warning("the tau evaluator died at the evaluation after step %d with no "
                        "restart left (train.recovery.max_restarts=%d): tau is not evaluated "
                        "for the rest of the job; training goes on", step, limit)
            return
        self.restarts += 1
        log.warning("the tau evaluator died at the evaluation after step %d: starting a new "
                    "one (restart %d of %d, train.recovery.max_restarts); training goes on",
                    step, self.restarts, limit)
        self._launch()  # not waited for: the next evaluation queues behind its start-up

    def _gone(self, step: int) -> EvalResult:
        return _failed(step, "no tau evaluator is left (it died more than "
                             f"train.recovery.max_restarts={self.job.train.recovery.max_restarts}"
                             " times)")


def _died(error: RayError, actor: Any) -> bool:
    """Whether ``error`` says ``actor`` died (not some other actor the call depended on)."""
    if not isinstance(error, RayActorError):
        return False
    return getattr(error, "actor_id", None) in (None, actor._actor_id.hex())


def _failed(step: int, why: str) -> EvalResult:
    return EvalResult(step=step, tau=math.nan, num_prompts=0, seconds=0.0, error=why)


def _first_line(error: BaseException) -> str:
    if isinstance(error, RayTaskError) and error.cause is not None:
        error = error.cause  # its first line names only the Ray task, not what went wrong
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"

