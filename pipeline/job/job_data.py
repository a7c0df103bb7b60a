"""The job's data, read, checked and encoded once, before Ray or any actor starts.

The driver and the single-process trainer call :func:`load_job_data` right after resolving
the job. The training file is encoded in full here (chat template, tokenizer, the too-short
check), since template errors and samples too short for a drafter block are only found by
encoding; the driver then hands the encoded set to the prefetcher, which never reads the file,
so the work is done once and each bad line is reported once. The held-out prompts of tau
evaluation are read here too, as far as evaluation reads them.

What stops the job here is one line (:class:`~pipeline.checks.preflight.PreflightError`, exit 2):
the first bad line with ``data.on_bad_line=error`` as ``file:line: reason``, or a file that
gives no usable sample (or no held-out prompt) with its counts.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

from pipeline.job.config import JobConfig
from pipeline.data import ChatDataset, DataError, DataStats
from pipeline.eval.tau import heldout_prompts
from pipeline.checks.preflight import PreflightError
from pipeline.job.resolve import ResolvedJob

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class JobData:
    train: ChatDataset
    heldout: Optional[list[list[int]]]  # prompt token ids; None when tau is not evaluated


def load_job_data(job: JobConfig, resolved: ResolvedJob, heldout: bool) -> JobData:
    """The encoded training set, and the held-out prompts when ``heldout`` (tau is on)."""
    from transformers import AutoTokenizer

    data, r = job.data, resolved
    tokenizer = AutoTokenizer.from_pretrained(r.target_path)
    started = time.perf_counter()
    train = _checked(lambda: ChatDataset(r.train_path, tokenizer, data, r.spec.block_size))
    if not len(train):
        raise PreflightError(
            f"{_where('data.train_path', data.train_path, r.train_path)}: no usable sample "
            f"(each needs >= {train.min_supervised} supervised tokens, twice "
            f"drafter.block_size): {train.stats.summary()}")
    log.info("data: %d samples encoded in %.1fs, before any actor starts",
             len(train), time.perf_counter() - started)
    if not heldout:
        return JobData(train, None)
    stats = DataStats()
    prompts = _checked(lambda: heldout_prompts(
        r.heldout_path, tokenizer, job.train.eval.prompts, data.format, data.enable_thinking,
        data.on_bad_line, stats, data.max_line_bytes))
    if not prompts:
        raise PreflightError(
            f"{_where('data.heldout_path', data.heldout_path, r.heldout_path)}: no held-out "
            f"prompt for tau (train.eval.prompts={job.train.eval.prompts}): {stats.lines} "
            f"line(s) = skipped_bad={stats.skipped_bad} + blank={stats.blank}; bad: "
            f"{stats.kinds_summary()}; point it at chat data or turn eval off "
            f"(train.eval.every=-1)")
    return JobData(train, prompts)


def _checked(read: Callable[[], T]) -> T:
    """``read()``, with a bad line (on_bad_line=error) as the job's one-line refusal."""
    try:
        return read()
    except DataError as e:
        reason = " ".join(str(e).splitlines())  # a template's message may span lines
        raise PreflightError(f"{reason} (data.on_bad_line=error; data.on_bad_line=skip "
                             f"leaves bad lines out and counts them)") from None


def _where(key: str, value: str, path: str) -> str:
    return f"{key}={value!r}" + ("" if value == path else f" ({path})")
