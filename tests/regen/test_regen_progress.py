"""The progress of a regeneration off a terminal: log lines with lines/s and tokens/s."""

import io
import re

from pipeline.regen.progress import LineProgress


def test_the_progress_line_gives_lines_and_tokens_per_second(caplog, monkeypatch):
    """Off a terminal (no bar) a line is logged at the end of the input: lines done of the
    total, resumed lines not counted in the rate, and the run's generated tokens per second."""
    clock = iter([100.0])  # the start; every later reading 4 s on
    monkeypatch.setattr("pipeline.regen.progress.time.perf_counter", lambda: next(clock, 104.0))
    monkeypatch.setattr("sys.stderr", io.StringIO())  # no terminal, even under pytest -s
    progress = LineProgress(total=10, resumed=2, skipped_bad=0)
    assert progress.bar.disable
    with caplog.at_level("INFO", logger="pipeline.regen.progress"):
        progress.advance(8, 0, tokens=2000)
    progress.close()
    [line] = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(r"regenerate: 10/10 lines, 2\.00 lines/s, 500 tokens/s, eta 0s, "
                        r"skipped 0", line), line
