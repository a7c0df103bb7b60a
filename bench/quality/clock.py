"""Stage timings against their wall-clock budgets, kept for the result file."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Iterator

log = logging.getLogger(__name__)


class StageClock:
    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.stages: dict[str, dict] = {}

    @contextmanager
    def stage(self, name: str, budget_s: float) -> Iterator[None]:
        t0 = time.perf_counter()
        log.info("=== %s (budget %.0f s, %.0f s into the run)", name, budget_s, t0 - self.start)
        try:
            yield
        finally:
            wall = time.perf_counter() - t0
            self.stages[name] = {"wall_s": round(wall, 1), "budget_s": budget_s}
            level = logging.WARNING if wall > budget_s else logging.INFO
            log.log(level, "=== %s done in %.1f s (budget %.0f s)", name, wall, budget_s)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start
