"""SIGTERM ends a job the way Ctrl-C does.

``ray job stop``, a scheduler's preemption and ``kill <driver pid>`` send SIGTERM. Python's
default for it kills the process on the spot, and once ``ray.init`` has run, Ray's core worker
answers it with a C++ stack trace (``*** SIGTERM received ... logging.cc``) before Python sees
it. Both skip every ``finally`` of the job: the actors, Ray, the run lock and a checkpoint being
written are left as they were.

An entry point calls :func:`install`: SIGTERM then raises :class:`Terminated` in the main
thread, a ``KeyboardInterrupt``, so it unwinds the job along Ctrl-C's path: each ``with`` and
``finally`` on the way out closes what it opened, and ``pipeline.train`` (or
``pipeline.regenerate``) ends with the one line that says how to resume (exit 143, 128 +
SIGTERM). A signal handler is per process and ``ray.init`` replaces this one (with a Python
handler of Ray's, then with the core worker's C++ one, which prints the trace and chains to
it), so the driver starts Ray through :func:`ray_session`, which installs it again right
after. A library caller (a test driving
``Driver.run``) that never called :func:`install` keeps its own handlers. SIGINT is taken
over also where the process was started ignoring it (a shell's background command).

How long the unwinding takes is bounded: the actors get :data:`GRACE_S` in all to close,
then are killed (pipeline/driver/actors.py), the evaluator a few seconds.

The first stop signal starts the unwinding; a SIGTERM that comes while it runs is logged and
ignored, so the closing is not cut short half way (``ray job stop`` sends one to the driver and
to each of its child processes; a scheduler may repeat it). A second Ctrl-C still interrupts,
as before: the person at the keyboard asks for it. What cannot be caught (SIGKILL, sent by
``ray job stop`` once ``RAY_JOB_STOP_WAIT_TIME_S`` has passed) leaves the lock and a staging
folder to the next job, which takes over the one and removes the other.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Iterator, Optional

import ray

from pipeline.runtime import ray_start

log = logging.getLogger(__name__)

# How long, in all, an interrupted job waits for its actors to close (each finishing the calls
# queued on it first, a drafter the checkpoint write in flight, which the driver drops
# anyway) before it kills them. Well inside the 120 s `ray job stop` leaves before its SIGKILL
# (launch/runtime_env.yaml): Ray's shutdown and the job's last line come after.
GRACE_S = 30.0

# Whether the entry point asked for these handlers (a library caller, a test, keeps its own),
# and the first stop signal (SIGINT or SIGTERM) this process got.
_installed = False
_stopping: Optional[str] = None


class Terminated(KeyboardInterrupt):
    """The process got SIGTERM. A KeyboardInterrupt, so that what handles Ctrl-C on the way out
    (``except KeyboardInterrupt``, ``except BaseException: ...; raise``) handles it too, and
    ``except Exception`` does not swallow it."""

    exit_code = 128 + signal.SIGTERM


def grace_for(exc_type: Optional[type]) -> Optional[float]:
    """What a ``with`` block's exit may wait for its actors in all: :data:`GRACE_S` when it
    unwinds a stop (Ctrl-C, SIGTERM), None (each close its own limit) otherwise."""
    stopping = exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
    return GRACE_S if stopping else None


def _by_sigterm(stop: KeyboardInterrupt) -> bool:
    # The first stop signal this process got decides, not only the exception that arrived:
    # code on the way out may catch the Terminated and raise a plain KeyboardInterrupt in its
    # place (seen once under `ray job stop` in the suite: the job's line said "interrupted").
    return isinstance(stop, Terminated) or _stopping == "SIGTERM"


def exit_code(stop: KeyboardInterrupt) -> int:
    """The exit status for an interrupted job: 143 after SIGTERM, 130 after Ctrl-C."""
    return Terminated.exit_code if _by_sigterm(stop) else 128 + signal.SIGINT


def cause(stop: KeyboardInterrupt) -> str:
    """How the job was stopped, for its last line."""
    return "stopped by SIGTERM" if _by_sigterm(stop) else "interrupted"


def install() -> None:
    """For an entry point: from now on SIGTERM raises :class:`Terminated`, and SIGINT
    KeyboardInterrupt as Python's default does, each noted so that a later SIGTERM does not cut
    the unwinding short. Main thread only (where Python runs signal handlers).

    SIGINT is taken over also when the process was started ignoring it: a shell without job
    control (a script, a CI runner) starts each ``cmd &`` so, Python keeps that, and every
    process the command starts inherits it: ``kill -INT`` (or Ctrl-C in the script's
    terminal) went unanswered while the job trained on (the fresh-clone suite, run as a
    background command: a job still training 300 s after its Ctrl-C). Only Python's own
    handler or an ignore is replaced; a handler a caller set stays. A SIGTERM the process was
    started to ignore stays ignored: no shell ignores it by itself, so someone asked for it."""
    global _installed
    if threading.current_thread() is not threading.main_thread():
        return
    _installed = True
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
        signal.signal(signal.SIGTERM, _on_sigterm)
    if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, signal.SIG_IGN):
        signal.signal(signal.SIGINT, _on_sigint)


def _on_sigterm(signum: int, frame: object) -> None:
    global _stopping
    if _stopping is not None:
        log.warning("SIGTERM while stopping (after %s): the job goes on closing its actors",
                    _stopping)
        return
    _stopping = "SIGTERM"
    raise Terminated()


def _on_sigint(signum: int, frame: object) -> None:
    global _stopping
    _stopping = _stopping or "SIGINT"
    raise KeyboardInterrupt()


@contextlib.contextmanager
def ray_session(address: Optional[str], cpus_needed: float) -> Iterator[None]:
    """:func:`pipeline.runtime.ray_start.ray_session`, then this module's handlers again where the
    entry point installed them: ray.init replaces the SIGTERM handler."""
    session = ray_start.ray_session(address, cpus_needed)
    try:
        session.__enter__()
    except SystemExit as exc:
        if not _installed or exc.code != signal.SIGTERM:
            raise
        raise _terminated_in_ray_init() from None
    if _installed:
        install()
    with contextlib.ExitStack() as stack:
        stack.push(session)  # its __exit__ shuts Ray down (if it started it), on any way out
        yield


def _terminated_in_ray_init() -> Terminated:
    """A SIGTERM during ray.init met Ray's own handler, ``sys.exit(15)``: the same stop as
    any other SIGTERM, once what ray.init had started is shut down."""
    global _stopping
    _stopping = _stopping or "SIGTERM"
    install()  # a further SIGTERM is ignored while this one unwinds
    if ray.is_initialized():
        ray.shutdown()
    return Terminated()
