"""Every tau evaluation's outcome in one job: counted, and each distinct error shown once.

A failed evaluation costs its figure, not the training job: training goes on. But a job whose
every evaluation failed has not measured what it was asked to, so the tally says so
(:attr:`EvalTally.all_failed`) and the entry point exits 1 once training and export are done.
An error is logged the first time it occurs; later failures with the same error are counted,
not repeated, so a broken evaluator shows its reason once, not once per evaluation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from pipeline.workers.eval_worker import EvalResult

log = logging.getLogger(__name__)


@dataclass
class EvalTally:
    # The setting that turns evaluation off (e.g. "train.eval.every=-1"), None when it is on.
    off: Optional[str]
    done: int = 0
    failed: int = 0
    # error -> when it first occurred ("before training", "at step 4", ...), in order
    _seen: dict[str, str] = field(default_factory=dict)

    @property
    def first_error(self) -> Optional[str]:
        return next(iter(self._seen), None)

    @property
    def first_failed(self) -> Optional[str]:
        """When the first failure happened, or None."""
        first = self.first_error
        return None if first is None else self._seen[first]

    @property
    def total(self) -> int:
        return self.done + self.failed

    @property
    def all_failed(self) -> bool:
        """Eval is on, evaluations ran, and none gave a tau."""
        return self.off is None and self.total > 0 and self.done == 0

    def record(self, result: EvalResult, when: str) -> bool:
        """Count ``result`` (``when``: "before training", "at step 4", ...); True when it
        holds a tau. A failure is logged with its error only the first time that error
        occurs."""
        if result.error is None:
            self.done += 1
            return True
        self.failed += 1
        if result.error in self._seen:
            log.info("tau %s failed with the error of the evaluation %s (%d of %d "
                     "evaluations failed so far)", when, self._seen[result.error], self.failed,
                     self.total)
            return False
        self._seen[result.error] = when
        log.warning("tau %s failed, the job goes on (failures are counted, each error is "
                    "shown once): %s", when, result.error)
        return False

    def metrics(self) -> dict[str, Any]:
        """The counts, for a metrics row and the run summary."""
        return {"eval/evaluations": self.total, "eval/failures": self.failed}

    def phrase(self, before: Optional[float], after: Optional[float]) -> str:
        """How the final line reports tau."""
        if self.off is not None:
            return f"tau not evaluated ({self.off})"
        return (f"tau evaluated {self.done} of {self.total} times "
                f"({_tau(before)} -> {_tau(after)})")

    def never_line(self) -> str:
        """Why the job has no tau: every evaluation failed (only when :attr:`all_failed`)."""
        assert self.all_failed, "some evaluation gave a tau"
        others = len(self._seen) - 1
        also = f", and {others} other error{'s' if others > 1 else ''}" if others else ""
        return (f"tau was never evaluated: all {self.total} tau evaluations failed (the first, "
                f"{self.first_failed}, with the error shown above{also})")


def _tau(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.3f}"
