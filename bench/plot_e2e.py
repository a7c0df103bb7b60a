"""Plot the e2e job's timeline from its driver log -> docs/bench/h200_e2e_8b.png.

    python -m bench.plot_e2e        # needs matplotlib (not a project dependency)

The x axis is seconds since the job's local Ray came up (the log's first line); each point is
a progress line (every train.log_every steps), and the job's events are marked: tau results,
checkpoints counted, the lost drafter and training again.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "bench"
_STAMP = re.compile(r"^(?:\S*\s)?\[?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")
_STEP = re.compile(r"step (\d+)/\d+ loss")
EVENTS = (("] - tau at step", "tau", "C2"), ("] - checkpoint ", "checkpoint counted", "C0"),
          ("lost drafter", "drafter SIGKILLed", "C3"), ("training again", "training again", "C1"))


def timeline(log_text: str) -> tuple[list[tuple[float, int]], list[tuple[float, str, str]]]:
    """(seconds, step) of every progress line and (seconds, label, colour) of every event,
    counted from the first timestamped line."""
    points, events, t0 = [], [], None
    for line in log_text.splitlines():
        m = _STAMP.search(line)
        if not m:
            continue
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1e3
        t0 = t if t0 is None else t0
        step = _STEP.search(line)
        if step:
            points.append((t - t0, int(step.group(1))))
        for needle, label, colour in EVENTS:
            if needle in line and "][pipeline.driver" in line:
                events.append((t - t0, label, colour))
    return points, events


def main() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log_text = (DOCS / "h200_e2e_8b_train.log").read_text()
    points, events = timeline(log_text)
    stamp = _STAMP.match(log_text)
    day = stamp.group(1)[:10] if stamp else "date unknown"
    fig, ax = plt.subplots(figsize=(9, 4.2))
    runs, last = [[]], 0
    for t, step in points:  # a new segment where a restart went back to an earlier step
        if step < last:
            runs.append([])
        runs[-1].append((t, step))
        last = step
    for i, run in enumerate(runs):
        ax.plot([p[0] for p in run], [p[1] for p in run], "k.-", lw=1,
                label="step reached" if i == 0 else None)
    seen = set()
    for t, label, colour in events:
        ax.axvline(t, c=colour, ls="--", lw=1, label=None if label in seen else label)
        seen.add(label)
    ax.set_xlabel("seconds since the job's Ray came up")
    ax.set_ylabel("training step")
    steps = max((step for _, step in points), default=0)
    ax.set_title(f"qwen3_8b on one H200, cluster=one_gpu, {steps} steps ({day})")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(DOCS / "h200_e2e_8b.png", dpi=110)
    print(f"wrote {DOCS / 'h200_e2e_8b.png'}")


if __name__ == "__main__":
    main()
