"""Helpers for tests that run `python -m pipeline.train` as a real process (not a test module:
pytest collects nothing here)."""

import re
import subprocess
import sys
import time
from pathlib import Path

from pipeline.checkpoint import folders as ckpt

ROOT = Path(__file__).resolve().parents[2]
# The per-epoch accounting line the driver logs (pipeline/driver/accounting.py).
EPOCH_LINE = re.compile(r"epoch (\d+): (\d+)/(\d+) planned samples trained, (\d+) missing, "
                        r"(\d+) repeated")


def wait_for(found, proc, what, timeout_s=300, poll_s=0.1):
    """Poll ``found()`` until true; fails when ``proc`` exits first or time runs out."""
    deadline = time.monotonic() + timeout_s
    while not found():
        assert proc.poll() is None, f"the job exited before {what} ({proc.returncode})"
        assert time.monotonic() < deadline, f"{what} never appeared"
        time.sleep(poll_s)


def group_left(pgid):
    """Processes still in the process group ``pgid`` (a driver's local Ray included)."""
    left = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[2] == str(pgid) and fields[0] != "Z":
            left.append(int(entry.name))
    return left


def group_gone(pgid, timeout_s=60.0) -> list:
    """Wait until the process group ``pgid`` is empty; what is left of it then. The driver's
    ray.shutdown() signals Ray's processes without waiting for them, so they end just after
    the driver does."""
    deadline = time.monotonic() + timeout_s
    while (left := group_left(pgid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def leftovers(out_dir):
    """What an unfinished checkpoint write leaves under out_dir/checkpoints (staging, aside)."""
    root = ckpt.checkpoint_root(out_dir)
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".")) \
        if root.is_dir() else []


def exact_epochs(text, last_epoch):
    """Assert each epoch line of a job's log trained every planned sample once, the last one
    being epoch ``last_epoch``; returns the lines as (epoch, trained, expected) tuples."""
    lines = EPOCH_LINE.findall(text)
    assert lines and int(lines[-1][0]) == last_epoch, text[-3000:]
    for epoch, trained, expected, missing, repeated in lines:
        assert trained == expected and missing == repeated == "0", (epoch, text[-3000:])
    return [(int(e), int(t), int(x)) for e, t, x, _, _ in lines]


def refused_before_ray(env, *overrides, timeout_s=300):
    """Run ``python -m pipeline.train OVERRIDES`` and assert it was refused as a check refuses:
    exit 2, no traceback, and Ray never mentioned (so never started). Returns the output."""
    proc = subprocess.run([sys.executable, "-m", "pipeline.train", *overrides], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout_s)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "Traceback" not in output and "Ray" not in output, output[-3000:]
    return output
