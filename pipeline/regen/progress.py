"""Lines done of the input: a tqdm bar on a terminal, a log line every so often elsewhere."""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

log = logging.getLogger(__name__)


class LineProgress:
    """Counts input lines handled: written now, found already written, or skipped as bad."""

    def __init__(self, total: int, resumed: int, skipped_bad: int,
                 log_every_s: float = 30.0) -> None:
        initial = resumed + skipped_bad
        self.total = total
        self.done = self.first = initial
        self.skipped_bad = skipped_bad
        self.log_every_s = log_every_s
        self.started = self.last_log = time.perf_counter()
        # Under `ray job submit` or CI a bar's carriage returns clutter the log: log instead.
        self.bar = tqdm(total=total, initial=initial, unit="line", dynamic_ncols=True,
                        desc="regenerate", disable=not sys.stderr.isatty())

    def advance(self, written: int, skipped_bad: int, tokens: int) -> None:
        """``written`` more lines, the reader's running count of skipped bad lines, and the
        run's running count of generated tokens."""
        lines = written + skipped_bad - self.skipped_bad
        self.skipped_bad = skipped_bad
        if lines == 0:
            return
        self.done += lines
        now = time.perf_counter()
        elapsed = max(now - self.started, 1e-9)
        self.bar.update(lines)
        self.bar.set_postfix(skipped=skipped_bad, tokens_per_s=f"{tokens / elapsed:.0f}",
                             refresh=False)
        if self.bar.disable and (now - self.last_log >= self.log_every_s
                                 or self.done >= self.total):
            self.last_log = now
            rate = (self.done - self.first) / elapsed
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            log.info("regenerate: %d/%d lines, %.2f lines/s, %.0f tokens/s, eta %.0fs, "
                     "skipped %d", self.done, self.total, rate, tokens / elapsed, eta,
                     skipped_bad)

    def close(self) -> None:
        self.bar.close()
