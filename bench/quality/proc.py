"""Subprocesses with a wall-clock budget: full log on the work disk, a short tail for --out.

A budget warns, it does not stop: a stage that overruns it on a noisy machine is reported as
over budget and finishes. Only a hard limit (scale.py: a multiple of the budget, and never
past the run's own limit) stops it, as a safety net for a run that hangs.
"""

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
    budget_s: float
    limit_s: float
    started: float


@dataclass
class Finished:
    name: str
    returncode: int
    wall_s: float
    budget_s: float
    limit_s: float
    stopped: bool  # still running at its hard limit, and interrupted
    log_path: Path

    @property
    def over_budget(self) -> bool:
        return self.wall_s > self.budget_s

    def report(self) -> dict:
        """What the result file keeps of the run against its budget."""
        return {"seconds": round(self.wall_s, 1), "budget_s": self.budget_s,
                "hard_limit_s": round(self.limit_s, 1), "over_budget": self.over_budget,
                "stopped": self.stopped}


def start(name: str, args: list[str], log_path: Path, budget_s: float,
          limit_s: float, sharing: int = 1) -> Job:
    """``python <args>`` from the repository root, stdout+stderr into ``log_path``; it is
    expected within ``budget_s`` and stopped only past ``limit_s``. ``sharing``: the jobs
    started to run at once, which split the host's cores between them."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    # Each torch process takes every core for its OpenMP threads by default: four trainers at
    # once on 2 cores took 61 s for what they do in 11 s with one thread each.
    env.setdefault("OMP_NUM_THREADS", str(threads_each(sharing)))
    # A private Ray cluster per subprocess. Without an address, ray.init joins the last
    # `ray start` cluster recorded on the machine, and the pipeline's init_ray then fails
    # ("num_cpus ... must not be provided"); "local" always starts a new one.
    env["RAY_ADDRESS"] = "local"
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, *args]
    log.info("%s: %s (budget %.0f s, stopped at %.0f s, log %s)", name, " ".join(cmd),
             budget_s, limit_s, log_path)
    with open(log_path, "w") as sink:
        popen = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=sink,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    return Job(name, popen, log_path, budget_s, limit_s, time.perf_counter())


def threads_each(sharing: int) -> int:
    """The host's cores split between ``sharing`` processes (at least one each)."""
    return max(1, (os.cpu_count() or 1) // max(1, sharing))


def wait(job: Job) -> Finished:
    """Wait until the job ends: past its budget with a warning, past its hard limit no
    longer (it is interrupted then, and what it logged so far is still read)."""
    if not _ends_within(job, job.budget_s):
        log.warning("%s: over its budget of %.0f s, letting it finish (stopped only at %.0f "
                    "s)", job.name, job.budget_s, job.limit_s)
    stopped = not _ends_within(job, job.limit_s)
    if stopped:
        log.warning("%s: still running at its hard limit of %.0f s (budget %.0f s), "
                    "interrupting it; raise the stage's budget in bench/quality/scale.py if "
                    "it was making progress", job.name, job.limit_s, job.budget_s)
        _stop(job.popen)
    wall = time.perf_counter() - job.started
    rc = job.popen.returncode
    level = logging.INFO if rc == 0 and wall <= job.budget_s else logging.WARNING
    log.log(level, "%s: exit %s after %.1f s (budget %.0f s)", job.name, rc, wall,
            job.budget_s)
    if rc != 0:
        sys.stderr.write(f"--- last lines of {job.log_path} ---\n{tail(job.log_path, 40)}\n")
    return Finished(job.name, rc, wall, job.budget_s, job.limit_s, stopped, job.log_path)


def _ends_within(job: Job, seconds: float) -> bool:
    """Whether the job ends within ``seconds`` of its start (waiting until then)."""
    try:
        job.popen.wait(timeout=max(0.0, job.started + seconds - time.perf_counter()))
    except subprocess.TimeoutExpired:
        return False
    return True


def run(name: str, args: list[str], log_path: Path, budget_s: float,
        limit_s: float) -> Finished:
    return wait(start(name, args, log_path, budget_s, limit_s))


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
