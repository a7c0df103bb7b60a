"""The driver's progress display: a bar on a terminal, a log line every few steps elsewhere."""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

log = logging.getLogger(__name__)


class Progress:
    def __init__(self, first_step: int, end_step: int, log_every: int) -> None:
        self.end_step = end_step
        self.log_every = log_every
        self.started = time.perf_counter()
        self.first_step = first_step
        # The logged rate covers the steps since the previous line: one step's rate says
        # little when the step loop closes several steps at once (3086 samples/s was logged
        # on the H200 for a step that closed 3 ms after the one before it).
        self._window_started = self.started
        self._window_samples = 0.0
        # On a terminal a live bar; under `ray job submit` or CI, periodic log lines instead.
        self.bar = tqdm(total=end_step, initial=first_step, unit="step", dynamic_ncols=True,
                        disable=not sys.stderr.isatty())

    def update(self, step: int, row: dict) -> None:
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{row['train/loss']:.4f}",
                             samples_s=f"{row['perf/samples_per_s']:.1f}", refresh=False)
        self._window_samples += row["train/samples"]
        if step % self.log_every == 0 or step == self.end_step:
            now = time.perf_counter()
            rate = (step - self.first_step) / max(now - self.started, 1e-9)
            eta = (self.end_step - step) / rate if rate > 0 else float("inf")
            window_rate = self._window_samples / max(now - self._window_started, 1e-9)
            self._window_started, self._window_samples = now, 0.0
            log.info("step %d/%d loss %.4f acc %.3f %.1f samples/s eta %.0fs", step,
                     self.end_step, row["train/loss"], row["train/accuracy"], window_rate, eta)

    def close(self) -> None:
        self.bar.close()
