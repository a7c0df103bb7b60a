"""SIGTERM as Ctrl-C, without Ray: the handler raises a KeyboardInterrupt that unwinds through
`finally`, a second SIGTERM does not cut the unwinding short, and a SIGTERM at any point of a
checkpoint's publish (staging -> durable) leaves a usable newest checkpoint and, once the job's
unfinished writes are discarded, nothing half-made."""

import os
import signal

import pytest

from pipeline.runtime import stop_signals
from pipeline.checkpoint import folders as ckpt
from pipeline.checkpoint.files import FileRecord, sha256_file
from pipeline.checkpoint.point import ResumePoint
from pipeline.runtime.stop_signals import Terminated


@pytest.fixture
def handlers(monkeypatch):
    """The module's handlers in this (pytest's) process, put back as they were afterwards.
    Installed over the handlers a fresh Python process starts with: an earlier test in the same
    worker (Ray's start-up among them) may have left others, which install() keeps."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(stop_signals, "_installed", False)
    monkeypatch.setattr(stop_signals, "_stopping", None)
    stop_signals.install()
    yield
    for s, handler in before.items():
        signal.signal(s, handler)


def _sigterm():
    os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler before the next bytecode


def test_sigterm_unwinds_like_ctrl_c_and_a_second_one_waits_for_it(handlers, caplog):
    unwound = []
    with pytest.raises(KeyboardInterrupt) as stop:
        try:
            _sigterm()
            pytest.fail("SIGTERM did not interrupt")
        finally:
            _sigterm()  # ray job stop signals every process of the job; a scheduler repeats
            unwound.append(True)
    assert isinstance(stop.value, Terminated) and unwound == [True]
    assert stop_signals.exit_code(stop.value) == 143
    assert stop_signals.cause(stop.value) == "stopped by SIGTERM"
    assert "SIGTERM while stopping" in caplog.text
    with pytest.raises(KeyboardInterrupt) as ctrl_c:  # Ctrl-C after it still interrupts
        os.kill(os.getpid(), signal.SIGINT)
    assert not isinstance(ctrl_c.value, Terminated)
    # The job was stopped by SIGTERM first: its line and status say so whatever came after,
    # and so they do when a library swapped the Terminated for a plain KeyboardInterrupt.
    for stop in (ctrl_c.value, KeyboardInterrupt()):
        assert stop_signals.exit_code(stop) == 143
        assert stop_signals.cause(stop) == "stopped by SIGTERM"


def test_ctrl_c_alone_is_an_interruption_with_status_130(handlers):
    with pytest.raises(KeyboardInterrupt) as ctrl_c:
        os.kill(os.getpid(), signal.SIGINT)
    assert stop_signals.exit_code(ctrl_c.value) == 130
    assert stop_signals.cause(ctrl_c.value) == "interrupted"


def test_a_job_started_ignoring_sigint_still_stops_on_it(monkeypatch):
    """A shell without job control (a script, a CI runner) starts `cmd &` ignoring SIGINT, and
    Python keeps that: the fresh-clone suite's job trained on 300 s past its Ctrl-C. The
    entry point takes SIGINT over; a SIGTERM started ignored stays so (someone chose it), and
    a handler a caller set stays its own."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setattr(stop_signals, "_installed", False)
    monkeypatch.setattr(stop_signals, "_stopping", None)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_signals.install()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        with pytest.raises(KeyboardInterrupt) as ctrl_c:
            os.kill(os.getpid(), signal.SIGINT)
        assert stop_signals.exit_code(ctrl_c.value) == 130

        def own(signum, frame):
            raise RuntimeError("the caller's own handler")
        signal.signal(signal.SIGINT, own)
        stop_signals.install()
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_only_a_stop_bounds_the_closing_of_actors():
    assert stop_signals.grace_for(KeyboardInterrupt) == stop_signals.GRACE_S
    assert stop_signals.grace_for(Terminated) == stop_signals.GRACE_S
    assert stop_signals.grace_for(None) is None
    assert stop_signals.grace_for(RuntimeError) is None


def _checkpoint(out, step, payload=b"weights"):
    staging = ckpt.staging_dir(out, step)
    (staging / "drafter.pt").write_bytes(payload)
    record = FileRecord("drafter.pt", len(payload), sha256_file(staging / "drafter.pt"))
    return ckpt.finalize(staging, ResumePoint(step=step, epoch=0, samples_done=4 * step),
                         [record], {}, keep_last=1)


# Where in a publish the signal lands, as (the call it comes right after, which call of it,
# whether the step is published again over a folder of the same step, whether the new
# checkpoint is in place afterwards): while the files are made durable; after the folder of
# the same step is moved aside; after the rename into place; while keep_last prunes.
POINTS = {"durable": ("fsync_file", 1, False, False), "aside": ("rename", 1, True, False),
          "renamed": ("rename", 1, False, True), "renamed over": ("rename", 2, True, True),
          "pruning": ("rename", 2, False, True)}


@pytest.mark.parametrize("point", sorted(POINTS))
def test_sigterm_during_a_publish_leaves_one_usable_newest_checkpoint(handlers, monkeypatch,
                                                                      tmp_path, point):
    out = tmp_path / "run"
    before = _checkpoint(out, 2)
    name, nth, again, published = POINTS[point]
    module = ckpt.os if name == "rename" else ckpt
    real, calls = getattr(module, name), []

    def signalled(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(args)
        if len(calls) == nth:
            _sigterm()
        return result
    monkeypatch.setattr(module, name, signalled)
    with pytest.raises(Terminated):
        _checkpoint(out, 2 if again else 4, b"newer weights")
    monkeypatch.setattr(module, name, real)
    ckpt.discard_unfinished(out)  # what the driver does once its actors are closed
    assert not [p for p in ckpt.checkpoint_root(out).iterdir() if p.name.startswith(".")]
    newest = ckpt.latest(out)
    assert newest is not None and all(ckpt.problem(p) is None for p in ckpt.step_folders(out))
    # Cut before the rename: the previous checkpoint, whole; after it: the new one.
    assert ((newest / "drafter.pt").read_bytes() == b"newer weights") == published
    if not published:
        assert newest == before
