"""Whether this process is an actor kept across jobs (pipeline.runtime.actor_pool.keep_actors).

A kept actor outlives its job's ``close``, so what a closing actor does for a process about
to be killed (removing its torch shm manager's folder, which the kill leaves behind) must
wait for the real end; the driver sweeps such folders once the process is gone.
"""

from __future__ import annotations

import os

ENV = "DFLASH_KEPT_ACTOR"


def mark() -> None:
    os.environ[ENV] = "1"


def kept() -> bool:
    return os.environ.get(ENV) == "1"
