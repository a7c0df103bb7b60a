"""Stage timings against their wall-clock budgets, kept for the result file.

A budget is what a stage is expected to take; overrunning it is a warning and a flag in the
result file (``over_budget``), never a failure. A stage's subprocess is stopped only at its
hard limit: ``hard_limit_factor`` times its budget, and never past ``run_limit_s`` from the
start of the run (or of its second GPU command, ``new_call``), so the result file is still
written before the command's own limit.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Iterator

log = logging.getLogger(__name__)


class StageClock:
    def __init__(self, hard_limit_factor: float = 3.0, run_limit_s: float = 0.0) -> None:
        """``run_limit_s`` 0: no limit on the whole run."""
        self.start = time.perf_counter()
        self.hard_limit_factor = hard_limit_factor
        self.run_limit_s = run_limit_s
        self.stages: dict[str, dict] = {}

    @contextmanager
    def stage(self, name: str, budget_s: float) -> Iterator[None]:
        t0 = time.perf_counter()
        log.info("=== %s (budget %.0f s, %.0f s into the run)", name, budget_s, t0 - self.start)
        try:
            yield
        finally:
            wall = time.perf_counter() - t0
            over = wall > budget_s
            self.stages[name] = {"budget_s": budget_s, "seconds": round(wall, 1),
                                 "over_budget": over}
            if over:
                log.warning("=== %s done in %.1f s: over its budget of %.0f s by %.0f%% "
                            "(reported, not stopped)", name, wall, budget_s,
                            100 * (wall / budget_s - 1) if budget_s else float("inf"))
            else:
                log.info("=== %s done in %.1f s (budget %.0f s)", name, wall, budget_s)

    def hard_limit_s(self, budget_s: float) -> float:
        """Seconds from now after which a subprocess with this budget is stopped."""
        limit = self.hard_limit_factor * budget_s
        if self.run_limit_s > 0:
            limit = min(limit, max(0.0, self.run_limit_s - self.elapsed()))
        return limit

    def new_call(self) -> None:
        """The run limit counts from now: the stages after this are a second GPU command's."""
        self.start = time.perf_counter()

    def over_budget(self) -> list[str]:
        return [name for name, stage in self.stages.items() if stage["over_budget"]]

    def elapsed(self) -> float:
        return time.perf_counter() - self.start
