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
        # On a terminal a live bar; under `ray job submit` or CI, periodic log lines instead.
        self.bar = tqdm(total=end_step, initial=first_step, unit="step", dynamic_ncols=True,
                        disable=not sys.stderr.isatty())

    def update(self, step: int, row: dict) -> None:
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{row['train/loss']:.4f}",
                             samples_s=f"{row['perf/samples_per_s']:.1f}", refresh=False)
        if step % self.log_every == 0 or step == self.end_step:
            elapsed = time.perf_counter() - self.started
            rate = (step - self.first_step) / max(elapsed, 1e-9)
            eta = (self.end_step - step) / rate if rate > 0 else float("inf")
            log.info("step %d/%d loss %.4f acc %.3f %.1f samples/s eta %.0fs", step,
                     self.end_step, row["train/loss"], row["train/accuracy"],
                     row["perf/samples_per_s"], eta)

    def close(self) -> None:
        self.bar.close()
