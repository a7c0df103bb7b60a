"""One job per run folder: ``<train.out_dir>/run.lock``, held while the job writes there.

Two jobs on one folder would delete each other's checkpoints in flight and interleave
metrics.jsonl, so the driver takes this lock before it writes anything into the folder or
starts Ray, and drops it on every way out. The file records its holder (pid, host, start
time, command) so that a refusal can name the job that holds the folder.

Taking it is atomic: ``O_CREAT | O_EXCL`` lets exactly one of two jobs started together create
the file. A lock left by a job that died (same host, pid gone, or the pid now belongs to a
younger process: the holder's start time from /proc is compared, as pids are reused) is taken
over with a warning. A takeover writes the new holder beside the lock and renames it over the
stale one, under a marker file named after the stale holder's token that only one job can
create, so two jobs that find the same stale lock cannot both win. A lock from another host
cannot be checked from here: it is refused with advice. Takes nest within one process:
``python -m pipeline.train`` holds the folder before the driver reads it to decide the resume,
and ``Driver.run`` (which tests call on their own) takes it again.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import socket
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from pipeline.checks.preflight import PreflightError

log = logging.getLogger(__name__)

LOCK_NAME = "run.lock"
# A creator writes its record right after O_EXCL creates the file: a reader that finds it
# empty waits this long for the record before calling the file unreadable. Generous: on a
# loaded machine a creator can stall for seconds between the two, and only a file a crash left
# empty ever waits it out.
_WRITE_GRACE_S = 10.0


# The locks this process holds (path -> holder, takes): the entry point takes the lock before
# the driver reads out_dir, and the driver's own take inside it is only counted.
_HELD: dict[Path, tuple["Holder", int]] = {}


class RunLocked(PreflightError):
    """The run folder is held by another job (or its lock cannot be judged)."""


@dataclass(frozen=True)
class Holder:
    """Who holds a run folder; ``token`` tells one taking of the lock from any other."""

    pid: int
    host: str
    started: str                 # local time, for people
    command: str
    token: str
    proc_start: Optional[int]    # /proc/<pid>/stat start time (clock ticks after boot)
    boot_id: Optional[str]       # /proc/sys/kernel/random/boot_id: a reboot frees every pid

    def describe(self) -> str:
        return (f"pid {self.pid} on host {self.host}, started {self.started}, "
                f"command: {self.command}")


def this_process(command: Optional[str] = None) -> Holder:
    pid = os.getpid()
    return Holder(pid=pid, host=socket.gethostname(),
                  started=datetime.now().astimezone().isoformat(timespec="seconds"),
                  command=command if command is not None else shlex.join(sys.orig_argv),
                  token=uuid.uuid4().hex, proc_start=process_start(pid), boot_id=_boot_id())


def process_start(pid: int) -> Optional[int]:
    """When ``pid`` started (clock ticks after boot), or None: no such process, or no /proc."""
    stat = _proc_stat(pid)
    return int(stat[19]) if stat else None


def is_running(holder: Holder) -> bool:
    """Whether ``holder`` (a process of this host) still runs."""
    if holder.boot_id and _boot_id() and holder.boot_id != _boot_id():
        return False  # rebooted since
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    stat = _proc_stat(holder.pid)
    if stat is None:
        return not Path("/proc/self/stat").exists()  # no /proc: trust the signal check
    if stat[0] in ("Z", "X"):
        return False  # exited, not yet reaped by its parent
    # The pid was reused by a younger process when the start times differ.
    return holder.proc_start is None or int(stat[19]) == holder.proc_start


class RunLock:
    """``with RunLock(out_dir): ...`` holds ``out_dir`` for this process; raises
    :class:`RunLocked` when another live job holds it. Takes nest within one process."""

    def __init__(self, out_dir: str | Path, command: Optional[str] = None) -> None:
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LOCK_NAME
        self.command = command
        self.holder: Optional[Holder] = None
        self._key = self.path

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def acquire(self) -> Holder:
        assert self.holder is None, f"{self.path} is already held by this RunLock"
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunLocked(f"train.out_dir={str(self.out_dir)!r}: cannot create the folder "
                            f"({exc})") from None
        self._key = self.path.resolve()
        if self._key in _HELD:  # this process holds it already: count the nested take
            holder, depth = _HELD[self._key]
            _HELD[self._key] = (holder, depth + 1)
        else:
            holder = self._take(this_process(self.command))
            _HELD[self._key] = (holder, 1)
        self.holder = holder
        return holder

    def release(self) -> None:
        """Drop this take; the last one removes the file if it is still this holder's. Safe
        to call when not held."""
        if self.holder is None:
            return
        mine, self.holder = self.holder, None
        _, depth = _HELD.pop(self._key)
        if depth > 1:
            _HELD[self._key] = (mine, depth - 1)
            return
        try:
            current = self._read(wait=False)
        except RunLocked as exc:  # release runs on the way out of an error: never mask it
            log.warning("%s: left in place", exc)
            return
        if current is None or current.token != mine.token:
            log.warning("%s is no longer held by this job (now: %s): left in place", self.path,
                        current.describe() if current else "absent")
            return
        self.path.unlink(missing_ok=True)

    def _take(self, me: Holder) -> Holder:
        # Each pass either wins, refuses, or saw the lock change under it (released, or taken
        # over by another job): then it looks again.
        for _ in range(20):
            if self._create(me):
                return me
            other = self._read()
            if other is None:
                continue  # released just now
            self._refuse_unless_stale(other, me.host)
            if self._take_over(other, me):
                log.warning("taking over %s: its holder (%s) is no longer running", self.path,
                            other.describe())
                return me
        raise RunLocked(f"train.out_dir={str(self.out_dir)!r}: {self.path} kept changing "
                        "while this job tried to take it; another job is starting on this "
                        "folder")

    def _create(self, me: Holder) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        except OSError as exc:
            raise RunLocked(f"train.out_dir={str(self.out_dir)!r}: cannot create {self.path} "
                            f"({exc})") from None
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(asdict(me)))
                f.flush()
                os.fsync(f.fileno())
        except BaseException:  # Ctrl-C or a full disk: leave no empty lock behind
            self.path.unlink(missing_ok=True)
            raise
        return True

    def _read(self, wait: bool = True) -> Optional[Holder]:
        """The holder on file; None when there is no lock file."""
        deadline = time.monotonic() + (_WRITE_GRACE_S if wait else 0.0)
        while True:
            try:
                text = self.path.read_text()
            except FileNotFoundError:
                return None
            try:
                return Holder(**json.loads(text))
            except (ValueError, TypeError):
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)  # its creator is still writing the record
        raise RunLocked(f"train.out_dir={str(self.out_dir)!r}: {self.path} is unreadable "
                        f"({len(text)} bytes, not a lock record); if no job uses this folder, "
                        "delete it and start again")

    def _refuse_unless_stale(self, other: Holder, host: str) -> None:
        where = f"train.out_dir={str(self.out_dir)!r}"
        if other.host != host:
            raise RunLocked(f"{where} is locked by a job on another host ({other.describe()})"
                            f", which cannot be checked from {host}: if that job no longer "
                            f"runs, delete {self.path}; otherwise pick another train.out_dir")
        if is_running(other):
            raise RunLocked(f"{where} is in use by another job ({other.describe()}); wait "
                            "for it to end, stop it, or pick another train.out_dir")

    def _take_over(self, stale: Holder, me: Holder) -> bool:
        """Replace the stale lock by ``me``; False when another job changed it first."""
        marker = self.path.with_name(f"{LOCK_NAME}.takeover-{stale.token}")
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return self._wait_for_takeover(marker, stale)
        try:
            current = self._read()
            if current is None or current.token != stale.token:
                return False  # another job took it over (or released it) in between
            staged = self.path.with_name(f"{LOCK_NAME}.{me.token}.new")
            try:
                staged.write_text(json.dumps(asdict(me)))
                os.replace(staged, self.path)
            finally:
                staged.unlink(missing_ok=True)
            return True
        finally:
            os.close(fd)
            marker.unlink(missing_ok=True)

    def _wait_for_takeover(self, marker: Path, stale: Holder) -> bool:
        """Another job is taking over the same stale lock: let it finish, then look again."""
        deadline = time.monotonic() + _WRITE_GRACE_S
        while marker.exists() and time.monotonic() < deadline:
            current = self._read()
            if current is None or current.token != stale.token:
                return False
            time.sleep(0.05)
        if marker.exists():
            raise RunLocked(f"train.out_dir={str(self.out_dir)!r}: a job that was taking over "
                            f"the stale {self.path} stopped half way ({marker} is left); if no "
                            f"job uses this folder, delete both files and start again")
        return False


def _proc_stat(pid: int) -> Optional[list[str]]:
    """Fields 3.. of /proc/<pid>/stat (state first); None when unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # the name in () may hold spaces


def _boot_id() -> Optional[str]:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
