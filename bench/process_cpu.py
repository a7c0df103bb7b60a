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

``--by-test N`` (around a pytest run) adds the N test files that cost most, counting every
process a test started: its CLI runs, their Ray clusters and actors, its bench subprocesses
(a process belongs to the test named in the PYTEST_CURRENT_TEST it inherited at its start).
Actors of a pytest worker's own long-lived cluster would all inherit the test that started the
cluster, so they are summed apart, as that worker's cluster.

    python -m bench.process_cpu --by-test 30 -- .venv/bin/python -m pytest -q -n 2 --dist loadgroup
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
         "ray::TargetStageWorker", "ray::GeneratorWorker", "ray::DashboardAgent",
         "ray::RuntimeEnvAgent", "ray::IDLE", "ray::", "dashboard.py",
         "autoscaler/_private/monitor.py", "log_monitor.py", "raylet/raylet", "gcs_server",
         "torch_shm_manager", "-m pipeline.train_single", "-m pipeline.train",
         "-m pipeline.regenerate", "-m pipeline.export", "-m bench.", "default_worker.py",
         "pytest", "-c import sys;exec(eval(sys.stdin.readline()))")
# Ray's own processes that the process calling ray.init starts for a local cluster.
RAY_OWN = {"raylet", "gcs_server", "dashboard.py", "Ray autoscaler monitor", "log_monitor.py"}
PYTEST = {"pytest-xdist worker", "pytest"}
# Plainer names for some of them.
LABELS = {"-c import sys;exec(eval(sys.stdin.readline()))": "pytest-xdist worker",
          "default_worker.py": "Ray worker (not yet an actor)",
          "ray::": "ray:: (tasks, the tests' own actors)",
          "raylet/raylet": "raylet", "autoscaler/_private/monitor.py": "Ray autoscaler monitor"}


def kind_of(cmdline: str) -> str:
    for kind in KINDS:
        if kind in cmdline:
            return LABELS.get(kind, kind)
    return "other: " + (cmdline.split(" ", 1)[0].rsplit("/", 1)[-1] or "(no command line)")


def _sample(seen: dict, tick: float) -> None:
    """Update ``seen`` {(pid, start): [first cpu, last cpu, cmdline, parent pid, test]} from
    /proc (the test: PYTEST_CURRENT_TEST as the process started with it, or "")."""
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
            seen[key] = [cpu, cpu, cmdline, fields[1], _test_of(pid)]


def _test_of(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return ""
    name = b"PYTEST_CURRENT_TEST="
    return next((e[len(name):].decode(errors="replace") for e in env if e.startswith(name)), "")


def by_kind(seen: dict) -> tuple[Counter, Counter]:
    """CPU-seconds and process counts per kind (only CPU used while sampled)."""
    cpu, count = Counter(), Counter()
    for first, last, cmdline, *_ in seen.values():
        kind = kind_of(cmdline)
        cpu[kind] += last - first
        count[kind] += 1
    return cpu, count


def by_test(seen: dict) -> Counter:
    """CPU-seconds per test file (see the module's docstring), per pytest worker's own Ray
    cluster, and per kind of process for what started outside any test."""
    by_pid = {pid: entry for (pid, _), entry in seen.items()}

    def shared_cluster(entry: list) -> Optional[str]:
        # Up the parents to the one pytest started (an xdist worker, or pytest itself without
        # -n): if that is one of Ray's own (the raylet, under which the actors run, or the GCS,
        # dashboard, monitors), the process belongs to that worker's cluster.
        for _ in range(8):
            parent = by_pid.get(entry[3])
            if parent is None:
                return None
            if kind_of(parent[2]) in PYTEST:
                return (f"the Ray cluster of pytest worker {entry[3]}"
                        if kind_of(entry[2]) in RAY_OWN else None)
            entry = parent
        return None

    cpu: Counter = Counter()
    for entry in seen.values():
        first, last, cmdline, _, test = entry
        group = shared_cluster(entry) or (test.split("::")[0] if test else
                                          f"(no test) {kind_of(cmdline)}")
        cpu[group] += last - first
    return cpu


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
    parser.add_argument("--by-test", type=int, default=0, metavar="N",
                        help="also the N test files that cost most (around a pytest run)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    if args.by_test < 0:
        parser.error(f"--by-test {args.by_test}: give a number of test files, 1 or more "
                     "(0, the default, leaves the table out)")
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
    if args.by_test:
        print("by test file:")
        for group, seconds in by_test(seen).most_common(args.by_test):
            print(f"{seconds:9.1f} CPU-s  {group}")
    print(f"{sum(cpu.values()):9.1f} CPU-s in all, sampled; wall {wall:.1f} s")
    if busy0 is not None and busy1 is not None:
        print(f"{(busy1 - busy0) / tick:9.1f} CPU-s busy on the machine (/proc/stat), "
              f"{os.cpu_count()} cores")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
