"""The driver's side of tau evaluation: one evaluator actor, fed weights behind steps.

An evaluation due after step s is two calls: ``weights`` on drafter rank 0, queued behind step
s (so it copies exactly the weights after s, and costs rank 0 a copy, not an evaluation), and
``evaluate`` on the evaluator with that ref. Ray moves the weights through the object store
to the evaluator, which runs while the drafters train on; the step loop collects the result
whenever it lands and it is logged at step s. Before and after training the driver simply
waits for the result (nothing else is running then).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import ray
import torch

from pipeline.config import JobConfig
from pipeline.driver.scheduler import AfterStepCall
from pipeline.ray_start import Placement, kill_actors, start_actor
from pipeline.resolve import ResolvedJob
from pipeline.workers.eval_worker import EvalResult, EvalWorker

log = logging.getLogger(__name__)

# How long the evaluator may take to be placed and built before the job stops with advice.
_PLACE_TIMEOUT_S = 300.0


class TauEvaluator:
    """Context-managed: the actor starts on entry (when eval is on) and is killed on exit."""

    def __init__(self, job: JobConfig, resolved: ResolvedJob,
                 prompts: Callable[[], list[list[int]]]) -> None:
        self.job = job
        self.r = resolved
        self._prompts = prompts
        self.actor: Any = None
        self.in_flight = 0  # evaluations sent behind steps and not yet back

    @property
    def enabled(self) -> bool:
        return self.job.train.eval.every >= 0 and self.job.train.eval.prompts > 0

    def __enter__(self) -> "TauEvaluator":
        if self.enabled:
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> None:
        e, r = self.job.train.eval, self.r
        gpus = e.gpus if r.device == "cuda" else 0.0
        self.actor = start_actor(
            EvalWorker, Placement(cpus=self.job.cluster.cpus_per_actor, gpus=gpus),
            spec=r.spec, target_path=r.target_path, device=r.device,
            target_dtype=r.autocast_dtype or torch.float32, prompts=self._prompts(),
            max_new_tokens=e.max_new_tokens, eos_token_id=r.eos_token_id)
        ready, _ = ray.wait([self.actor.__ray_ready__.remote()], timeout=_PLACE_TIMEOUT_S)
        if ready:
            ray.get(ready[0])  # a failed constructor raises here, not at the first evaluation
        else:
            raise ValueError(
                f"the tau evaluator (train.eval.gpus={e.gpus:g} GPU, "
                f"cluster.cpus_per_actor={self.job.cluster.cpus_per_actor:g} CPU) found no room "
                f"in {_PLACE_TIMEOUT_S:.0f}s beside the training actors: lower "
                f"cluster.gpus_per_actor so each GPU keeps train.eval.gpus free, or turn eval "
                f"off (train.eval.every=-1)")

    def close(self) -> None:
        if self.actor is None:
            return
        try:
            ray.get(self.actor.close.remote(), timeout=60)
        except Exception as exc:  # a dead evaluator must not hide the original error
            log.warning("closing the tau evaluator failed: %s", exc)
        kill_actors([self.actor])
        self.actor = None

    def result_ref(self, drafter: Any, step: int) -> Any:
        """ObjectRef of an :class:`EvalResult` for ``drafter``'s weights as of now in its
        queue (behind every call already sent to it)."""
        assert self.actor is not None, "the tau evaluator is not started"
        return self.actor.evaluate.remote(drafter.weights.remote(), step)

    def evaluate(self, drafter: Any, step: int) -> Optional[EvalResult]:
        """Evaluate now and wait (before or after training); None when eval is off."""
        if not self.enabled:
            return None
        return ray.get(self.result_ref(drafter, step))

    def behind_step(self, drafter: Any, step: int,
                    on_done: Callable[[EvalResult], None]) -> AfterStepCall:
        """The evaluation of the weights after ``step`` steps, for the step loop to collect."""
        self.in_flight += 1
        if self.in_flight > 1:  # each queued one holds a copy of the weights in the store
            log.warning("tau evaluations fall behind training: %d queued (the one after step "
                        "%d included); raise train.eval.every or lower train.eval.prompts",
                        self.in_flight, step)

        def done(result: EvalResult) -> None:
            self.in_flight -= 1
            on_done(result)
        return AfterStepCall(self.result_ref(drafter, step), done)

