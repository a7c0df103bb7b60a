"""Subprocesses with a wall-clock budget: full log on the work disk, a short tail for --out."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
_GRACE_S = 20.0  # after SIGINT, before SIGKILL: lets Ray shut its local cluster down


@dataclass
class Job:
    name: str
    popen: subprocess.Popen
    log_path: Path
    deadline: float
    started: float


@dataclass
class Finished:
    name: str
    returncode: int
    wall_s: float
    timed_out: bool
    log_path: Path


def start(name: str, args: list[str], log_path: Path, budget_s: float) -> Job:
    """``python <args>`` from the repository root, stdout+stderr into ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    # A private Ray cluster per subprocess. Without an address, ray.init joins the last
    # `ray start` cluster recorded on the machine, and the pipeline's init_ray then fails
    # ("num_cpus ... must not be provided"); "local" always starts a new one.
    env["RAY_ADDRESS"] = "local"
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, *args]
    log.info("%s: %s (budget %.0f s, log %s)", name, " ".join(cmd), budget_s, log_path)
    with open(log_path, "w") as sink:
        popen = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=sink,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    now = time.perf_counter()
    return Job(name, popen, log_path, now + budget_s, now)


def wait(job: Job) -> Finished:
    """Wait until the job ends or its budget is spent; an overdue job is interrupted."""
    timed_out = False
    try:
        job.popen.wait(timeout=max(0.0, job.deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        timed_out = True
        log.warning("%s: over its budget, interrupting it", job.name)
        _stop(job.popen)
    wall = time.perf_counter() - job.started
    rc = job.popen.returncode
    level = logging.INFO if rc == 0 else logging.WARNING
    log.log(level, "%s: exit %s after %.1f s", job.name, rc, wall)
    if rc != 0:
        sys.stderr.write(f"--- last lines of {job.log_path} ---\n{tail(job.log_path, 40)}\n")
    return Finished(job.name, rc, wall, timed_out, job.log_path)


def run(name: str, args: list[str], log_path: Path, budget_s: float) -> Finished:
    return wait(start(name, args, log_path, budget_s))


def _stop(popen: subprocess.Popen) -> None:
    # Only the group this script started (start_new_session), by its id.
    pgid = os.getpgid(popen.pid)
    os.killpg(pgid, signal.SIGINT)
    try:
        popen.wait(timeout=_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(pgid, signal.SIGKILL)
        popen.wait()


def tail(path: Path, lines: int) -> str:
    if not path.exists():
        return ""
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])
