"""The progress line's rate covers the window since the previous line, not its last step."""

import logging

from pipeline.driver import progress as progress_mod
from pipeline.driver.progress import Progress


def _row(samples_per_s: float, step_time_s: float) -> dict:
    return {"train/loss": 1.0, "train/accuracy": 0.5, "perf/samples_per_s": samples_per_s,
            "perf/step_time_s": step_time_s, "train/samples": samples_per_s * step_time_s}


def test_logged_rate_is_the_window_rate(monkeypatch, caplog):
    clock = iter([0.0, 10.0, 20.0])  # construction, the line at step 2, the line at step 4
    monkeypatch.setattr(progress_mod.time, "perf_counter", lambda: next(clock))
    p = Progress(first_step=0, end_step=4, log_every=2)
    with caplog.at_level(logging.INFO, logger=progress_mod.__name__):
        p.update(1, _row(8.0, 5.0))        # 40 samples
        p.update(2, _row(4000.0, 0.0025))  # 10 samples, closed right behind step 1
        p.update(3, _row(2.0, 5.0))        # 10 samples
        p.update(4, _row(2.0, 5.0))        # 10 samples
    p.close()
    lines = [r.getMessage() for r in caplog.records]
    assert " 5.0 samples/s" in lines[0], lines  # 50 samples over the first 10 s
    assert " 2.0 samples/s" in lines[1], lines  # 20 samples over the next 10 s
    assert "4000" not in " ".join(lines)
