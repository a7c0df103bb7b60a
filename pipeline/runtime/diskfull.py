"""A full disk, said once and plainly: which file could not be written, and nothing half-written.

The libraries lose what matters: torch.save reports a failed write as ``RuntimeError: [enforce
fail at inline_container.cc] unexpected pos``, safetensors as ``SafetensorError: ... (os error
28)``, and a failed ``write()`` names no file. Each writer of a job (checkpoint, state.json,
export, trace.json, metrics.jsonl) wraps its write in :func:`writing`, which turns ENOSPC or
EDQUOT into a :class:`DiskFullError` naming the file. Whole files are written under a
temporary name and renamed once complete (:func:`write_atomic`), so a full disk leaves the
old file or none, never an empty or cut-off one. A failure while cleaning up after another
error is logged, never raised over it (:func:`secondary`): the first error is the headline.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import sys
from pathlib import Path
from typing import Iterator, Optional, Union

from pipeline.runtime.error_chain import chain

log = logging.getLogger(__name__)

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
PathLike = Union[str, os.PathLike]
# How Rust's io::Error (safetensors) prints the errno it failed with.
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


class DiskFullError(OSError):
    """ENOSPC or EDQUOT while writing ``filename``."""


def disk_full_error(path: PathLike, code: int = errno.ENOSPC) -> DiskFullError:
    return DiskFullError(code, os.strerror(code), str(path))


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


@contextlib.contextmanager
def writing(path: PathLike) -> Iterator[None]:
    """Raise a full disk met inside the block as a :class:`DiskFullError` naming ``path``."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as exc:
        if exc.errno in DISK_FULL:
            raise disk_full_error(path, exc.errno) from exc
        raise


def rust_os_error(exc: BaseException) -> Optional[int]:
    """The errno in a Rust I/O error's message (``... (os error 28)``), else None."""
    found = _RUST_OS_ERROR.search(str(exc))
    return int(found.group(1)) if found else None


def temp_name(path: PathLike) -> Path:
    """Where :func:`write_atomic` writes ``path`` before renaming it (hidden, per process)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_atomic(path: PathLike, data: Union[str, bytes]) -> Path:
    """Write ``path`` whole or not at all: a temporary name, fsynced, then renamed onto it.
    On failure the temporary file is removed and an older ``path`` is left as it was."""
    path = Path(path)
    tmp = temp_name(path)
    payload = data.encode() if isinstance(data, str) else data
    try:
        with writing(path):
            with open(tmp, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def find_disk_full(exc: BaseException) -> Optional[OSError]:
    """The first full-disk OSError in ``exc``'s chain, looking into Ray task errors too."""
    return next((e for e in chain(exc) if is_disk_full(e)), None)


def disk_full_headline(exc: BaseException, kept: Optional[PathLike]) -> Optional[str]:
    """The one line a job ends with when ``exc`` comes from a full disk (else None): the file
    that could not be written and the checkpoint that is kept."""
    full = find_disk_full(exc)
    if full is None:
        return None
    what = "no space left on device" if full.errno == errno.ENOSPC \
        else "no space left on device (disk quota exceeded)"
    path = full.filename if full.filename is not None else "a file (its path was not reported)"
    if kept is None:
        after = "no checkpoint of this run was written before it; free space, then rerun"
    else:
        after = (f"kept: the previous checkpoint {kept}; free space, then rerun with "
                 "train.checkpoint.resume=auto to go on from it")
    return f"{what}: could not write {path}; {after}"


@contextlib.contextmanager
def secondary(what: str) -> Iterator[None]:
    """Clean-up (closing files, writing the trace) after the job's work: with an error already
    on its way out, a failure here is logged in one line and that error stays the headline;
    with none, a failure here is raised."""
    in_flight = sys.exc_info()[1]
    try:
        yield
    except Exception as exc:
        if in_flight is None:
            raise
        log.warning("%s failed too (%s); the first error stands", what, exc)
