"""A full disk is named, with its file: torch.save's "inline_container.cc ... unexpected pos" is
recognised by the OSError behind it (never by its text), whole-file writes leave the old file
or none, and the headline digs the error out of Ray's task errors.

The ENOSPC here is real: the file is a symlink to /dev/full, the kernel's always-full device.
(Never let a writer rename onto /dev/full itself: as root that replaces the device node.)
"""

import errno
import logging
import os
import stat
from pathlib import Path

import pytest
import torch
from ray.exceptions import RayTaskError

from pipeline.runtime.diskfull import (DiskFullError, disk_full_error, disk_full_headline,
                               find_disk_full, rust_os_error, secondary, temp_name,
                               write_atomic)
from pipeline.checkpoint.files import save_state

FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(
    not (FULL.exists() and stat.S_ISCHR(FULL.stat().st_mode)),
    reason="/dev/full (the kernel's always-full device) is missing on this machine")


def full_at(path: Path) -> Path:
    """``path`` as a file on a full disk: writes through it fail with ENOSPC."""
    path.symlink_to(FULL)
    return path


@needs_dev_full
@pytest.mark.parametrize("numel", [10, 1 << 20])  # inside one buffer, and past it
def test_torch_save_on_a_full_disk_names_the_file(tmp_path, numel):
    path = full_at(tmp_path / "drafter.pt")
    with pytest.raises(DiskFullError) as info:
        save_state({"w": torch.zeros(numel)}, path)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(path)
    line = disk_full_headline(info.value, kept=None)
    assert line.startswith(f"no space left on device: could not write {path};")
    assert "inline_container" not in line


def test_other_write_failures_are_not_called_a_full_disk(tmp_path):
    with pytest.raises(FileNotFoundError):
        save_state({"w": torch.zeros(3)}, tmp_path / "missing" / "drafter.pt")
    with pytest.raises(Exception) as info:  # torch.save fails before any byte is written
        save_state({"f": lambda: None}, tmp_path / "drafter.pt")
    assert not isinstance(info.value, DiskFullError)
    # torch's own message alone says nothing about why: it is not taken for a full disk.
    torn = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert find_disk_full(torn) is None and disk_full_headline(torn, kept=None) is None
    assert find_disk_full(OSError(errno.EIO, "Input/output error", "x")) is None
    assert rust_os_error(RuntimeError("I/O error: No space left on device (os error 28)")) == 28
    assert rust_os_error(RuntimeError("header too large")) is None


@needs_dev_full
def test_a_whole_file_write_on_a_full_disk_keeps_the_old_file(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text("old")
    full_at(temp_name(path))
    with pytest.raises(DiskFullError) as info:
        write_atomic(path, "x" * 100_000)
    assert info.value.filename == str(path)
    assert path.read_text() == "old" and not os.path.lexists(temp_name(path))
    fresh = tmp_path / "fresh.json"
    full_at(temp_name(fresh))
    with pytest.raises(DiskFullError):
        write_atomic(fresh, "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]
    assert write_atomic(fresh, "{}").read_text() == "{}"


def test_the_headline_names_the_file_and_the_kept_checkpoint_through_ray():
    cause = disk_full_error("/run/export/model.safetensors")
    from_actor = RayTaskError("DrafterWorker.export", "Traceback ...", cause).as_instanceof_cause()
    try:
        try:
            raise from_actor
        finally:
            raise RuntimeError("a later error raised while the first was on its way out")
    except RuntimeError as exc:
        line = disk_full_headline(exc, kept="/run/checkpoints/step_00000002")
    assert line == ("no space left on device: could not write /run/export/model.safetensors; "
                    "kept: the previous checkpoint /run/checkpoints/step_00000002; free space, "
                    "then rerun with train.checkpoint.resume=auto to go on from it")
    quota = disk_full_headline(disk_full_error("/q/state.json", errno.EDQUOT), kept=None)
    assert quota.startswith("no space left on device (disk quota exceeded): could not write "
                            "/q/state.json; no checkpoint")


def test_a_failed_cleanup_never_replaces_the_first_error(caplog):
    with caplog.at_level(logging.WARNING), pytest.raises(DiskFullError, match="drafter.pt"):
        try:
            raise disk_full_error("/run/drafter.pt")
        finally:
            with secondary("writing trace.json"):
                raise disk_full_error("/run/trace.json")
    assert "writing trace.json failed too" in caplog.text
    assert "the first error stands" in caplog.text
    # With no error on its way out, the clean-up's own failure is the error.
    with pytest.raises(DiskFullError, match="trace.json"):
        with secondary("writing trace.json"):
            raise disk_full_error("/run/trace.json")
