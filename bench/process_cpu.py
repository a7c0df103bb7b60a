"""Where a command's CPU goes, by kind of process: Ray actors by class, Ray's own processes,
our CLIs, pytest.

    python -m bench.process_cpu -- .venv/bin/python -m pytest -q -n 2 --dist loadgroup tests/driver

Runs the command and samples every process of the machine every ``--every`` seconds from
/proc (Linux): each process's CPU time (user + system) since it was first seen, under the
newest command line seen for it (a Ray worker renames itself ``ray::ClassName`` once it
becomes an actor). Prints one line per kind, most CPU first, then the total and the
machine's busy CPU-seconds from /proc/stat over the same time. A process that lives less
than one interval may be missed; one that existed before the command counts from its first
sample only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from typing import Optional

# Kinds, matched in this order against a process's command line (first match wins).
KINDS = ("ray::TargetWorker", "ray::DrafterWorker", "ray::Prefetcher", "ray::EvalWorker",
         "ray::StageWorker", "ray::RegenWorker", "ray::DashboardAgent", "ray::RuntimeEnvAgent",
         "ray::IDLE", "ray::", "dashboard.py", "autoscaler/_private/monitor.py", "log_monitor.py",
         "raylet/raylet", "gcs_server", "torch_shm_manager", "-m pipeline.train_single",
         "-m pipeline.train", "-m pipeline.regenerate", "-m pipeline.export", "-m bench.",
         "default_worker.py", "pytest", "-c import sys;exec(eval(sys.stdin.readline()))")
# Plainer names for some of them.
LABELS = {"-c import sys;exec(eval(sys.stdin.readline()))": "pytest-xdist worker",
          "default_worker.py": "Ray worker (not yet an actor)", "ray::": "ray:: (tasks)",
          "raylet/raylet": "raylet", "autoscaler/_private/monitor.py": "Ray autoscaler monitor"}


def kind_of(cmdline: str) -> str:
    for kind in KINDS:
        if kind in cmdline:
            return LABELS.get(kind, kind)
    return "other: " + (cmdline.split(" ", 1)[0].rsplit("/", 1)[-1] or "(no command line)")


def _sample(seen: dict, tick: float) -> None:
    """Update ``seen`` {(pid, start): [first cpu, last cpu, cmdline]} from /proc."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline") as f:
                cmdline = f.read().replace("\0", " ").strip()
        except (OSError, IndexError):
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick
        key = (pid, fields[19])
        if key in seen:
            seen[key][1] = cpu
            seen[key][2] = cmdline or seen[key][2]
        else:
            seen[key] = [cpu, cpu, cmdline]


def by_kind(seen: dict) -> tuple[Counter, Counter]:
    """CPU-seconds and process counts per kind (only CPU used while sampled)."""
    cpu, count = Counter(), Counter()
    for first, last, cmdline in seen.values():
        kind = kind_of(cmdline)
        cpu[kind] += last - first
        count[kind] += 1
    return cpu, count


def _busy_jiffies() -> Optional[int]:
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    return sum(values) - values[3] - values[4]  # all but idle and iowait


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=0.3, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    tick = float(os.sysconf("SC_CLK_TCK"))
    seen: dict = {}
    _sample(seen, tick)
    for entry in seen.values():  # what ran before counts from now: its first sample
        entry[0] = entry[1]
    busy0, t0 = _busy_jiffies(), time.time()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        _sample(seen, tick)
        time.sleep(args.every)
    _sample(seen, tick)
    busy1, wall = _busy_jiffies(), time.time() - t0
    cpu, count = by_kind(seen)
    for kind, seconds in cpu.most_common():
        if seconds >= 0.05:
            print(f"{seconds:9.1f} CPU-s {count[kind]:5d} processes  {kind}")
    print(f"{sum(cpu.values()):9.1f} CPU-s in all, sampled; wall {wall:.1f} s")
    if busy0 is not None and busy1 is not None:
        print(f"{(busy1 - busy0) / tick:9.1f} CPU-s busy on the machine (/proc/stat), "
              f"{os.cpu_count()} cores")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
