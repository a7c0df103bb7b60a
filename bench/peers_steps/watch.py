"""One trainer subprocess, watched: its lines timestamped as they come, the GPU's memory sampled
about once a second, and a stop (SIGINT, as Ctrl-C) at its budget.

Every trainer is timed by the same clock (``time.time()`` in this process, the wall clock the
pipeline's metrics.jsonl also writes), from its launch: the time to its first step, the marks
at which checkpoints count, and the stop. Peak GPU memory of a subprocess is not reachable
through torch from here: the device memory in use (bench/card.py), less what was in use before
the launch.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from bench.card import GpuMemory
from bench.quality.proc import REPO_ROOT, threads_each

log = logging.getLogger(__name__)
_GRACE_S = 60.0  # after the stop signal: a peer saves its interrupted checkpoint then


@dataclass
class Watched:
    """What a watched run left: its lines with their arrival times, its exit and timing."""

    name: str
    launched: float  # time.time() at launch
    lines: list[tuple[float, str]] = field(default_factory=list)
    returncode: Optional[int] = None
    stopped_at_budget: bool = False
    ended: float = 0.0
    peak_gpu_mib: Optional[float] = None

    def first(self, pattern: str) -> Optional[tuple[float, re.Match]]:
        rx = re.compile(pattern)
        for t, line in self.lines:
            m = rx.search(line)
            if m:
                return t, m
        return None

    def all(self, pattern: str) -> list[tuple[float, re.Match]]:
        rx = re.compile(pattern)
        return [(t, m) for t, line in self.lines for m in [rx.search(line)] if m]


def run_watched(name: str, cmd: list[str], log_path: Path, env: dict,
                first_step: Callable[[Watched], Optional[float]], budget_s: float,
                limit_s: float, on_line: Optional[Callable[[float, str], None]] = None,
                stop_signal: Optional[int] = signal.SIGINT) -> Watched:
    """Run ``cmd`` until it exits, or until ``budget_s`` after its first step (``first_step``
    returns that time once the lines show it), when it gets ``stop_signal`` (None: it stops
    by itself); ``limit_s`` after launch it is stopped whatever it does."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**env, "PYTHONUNBUFFERED": "1", "COLUMNS": "400", "RAY_ADDRESS": "local"}
    env.setdefault("OMP_NUM_THREADS", str(threads_each(1)))
    w = Watched(name, time.time())
    log.info("%s: %s (log %s)", name, " ".join(cmd), log_path)
    with open(log_path, "w") as sink, GpuMemory(period_s=1.0) as mem:
        popen = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, errors="replace",
                                 start_new_session=True)
        reader = threading.Thread(target=_read, args=(popen, w, sink, on_line), daemon=True)
        reader.start()
        signalled = None
        while popen.poll() is None:
            now = time.time()
            start = first_step(w)
            if (signalled is None and stop_signal is not None and start is not None
                    and now >= start + budget_s):
                w.stopped_at_budget = True
                signalled = now
                log.info("%s: budget reached (%.0f s after its first step): stopping it", name,
                         budget_s)
                _signal(popen, stop_signal)
            elif now - w.launched > limit_s and (signalled is None or now - signalled > _GRACE_S):
                log.warning("%s: still running %.0f s after launch: killing it", name,
                            now - w.launched)
                _signal(popen, signal.SIGKILL)
                signalled = signalled or now
            elif signalled is not None and now - signalled > _GRACE_S:
                _signal(popen, signal.SIGKILL)
            time.sleep(0.2)
        reader.join(timeout=10)
        w.returncode, w.ended = popen.returncode, time.time()
    w.peak_gpu_mib = mem.peak_added_mib()
    level = logging.INFO if w.returncode == 0 or w.stopped_at_budget else logging.WARNING
    log.log(level, "%s: exit %s after %.1f s", name, w.returncode, w.ended - w.launched)
    return w


def _read(popen: subprocess.Popen, w: Watched, sink, on_line) -> None:
    for line in popen.stdout:
        t = time.time()
        w.lines.append((t, line.rstrip("\n")))
        sink.write(line)
        sink.flush()
        if on_line is not None:
            on_line(t, line)


def _signal(popen: subprocess.Popen, sig: int) -> None:
    try:  # the process group this module started (start_new_session), by its id
        os.killpg(os.getpgid(popen.pid), sig)
    except ProcessLookupError:
        pass


def python(*args: str) -> list[str]:
    return [sys.executable, *args]
