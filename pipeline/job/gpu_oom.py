"""A GPU out of memory, said once and plainly: which actor ran out, what it asked for, what the
card held and by whom, the settings of this job that shrink that actor, and the checkpoint kept.

Without this the job ends in Hydra's "Error executing job", Ray's task-error banner and an
inductor traceback of 60 lines, the one useful line (torch's message) at the bottom. Seen at
the 8B recipe on one 80 GB H100 (2026-12-05): target, drafter and tau evaluator on one card,
the drafter's first step asked for 1.16 GiB with 0.9 free.
"""

from __future__ import annotations

import re
import sys
from typing import Callable, Optional

from pipeline.job.config import JobConfig
from pipeline.runtime.error_chain import chain

_SIZE = r"[\d.]+ [KMGT]?i?B"
_TRIED = re.compile(rf"Tried to allocate ({_SIZE})")
_CARD = re.compile(rf"GPU (\d+) has a total capacity of ({_SIZE}) of which ({_SIZE}) is free")
_PROCESS = re.compile(rf"Process (\d+) has ({_SIZE}) memory in use")
_THIS = re.compile(rf"this process has ({_SIZE}) memory in use")
# Ray's banner on a task error: "ray::DrafterWorker.forward_backward() (pid=5288, ...".
_WHERE = re.compile(r"ray::([\w.]+)\(\)(?:\S*)\s*\(pid=(\d+)")
# Messages of an allocation failure that torch does not raise as OutOfMemoryError.
_OTHER = ("CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED")


def is_gpu_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")  # not imported for it: without torch, nothing ran on a GPU
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OTHER)


def _knobs(job: JobConfig, actor: str) -> list[str]:
    """The settings that shrink ``actor``'s memory, with this job's values."""
    d = job.data
    if d.batching == "pad":
        shape = [f"data.micro_batch_size={d.micro_batch_size}", f"data.max_length={d.max_length}"]
    else:
        shape = [f"data.tokens_per_micro_batch={d.tokens_per_micro_batch}",
                 f"data.anchors_per_micro_batch={d.anchors_per_micro_batch}"]
    if actor.startswith("Drafter"):
        return shape + [f"drafter.num_anchors={job.drafter.num_anchors}"]
    if actor.startswith(("Target", "Stage")):
        return shape + [f"target.stages={job.target.stages} (more stages split its layers)"]
    if actor.startswith("Eval"):
        return [f"train.eval.batch_size={job.train.eval.batch_size}"]
    return shape


def gpu_oom_line(exc: BaseException, knobs_of: Callable[[str], list[str]],
                 tail: str) -> Optional[str]:
    """``out of GPU memory in <actor>: <figures>. Settings that shrink it: <knobs>; <tail>``
    when ``exc`` comes from a GPU out of memory, else None. ``knobs_of(actor class name)``
    gives the settings with their values."""
    found = [e for e in chain(exc) if is_gpu_oom(e)]
    if not found:
        return None
    where = next((m for m in (_WHERE.search(str(e)) for e in chain(exc)) if m), None)
    actor = where.group(1) if where else ""
    # The deepest: the actor's own error, not Ray's copy with its banner and traceback.
    text = " ".join(str(found[-1]).split())
    parts = []
    if (tried := _TRIED.search(text)) is not None:
        parts.append(f"it asked for {tried.group(1)}")
    if (card := _CARD.search(text)) is not None:
        parts.append(f"GPU {card.group(1)} ({card.group(2)}) had {card.group(3)} free")
    held = [f"pid {pid} {size}" for pid, size in _PROCESS.findall(text)]
    if (this := _THIS.search(text)) is not None:
        held.append(f"this one {this.group(1)}")
    if held:
        parts.append("held: " + ", ".join(held))
    who = f"{actor} (pid {where.group(2)})" if where else "a process of this job"
    line = f"out of GPU memory in {who}"
    line += f": {'; '.join(parts)}" if parts else f": {text[:200]}"
    return f"{line}. Settings that shrink it: {', '.join(knobs_of(actor.split('.')[0]))}; {tail}"


def gpu_oom_headline(exc: BaseException, job: JobConfig, kept: Optional[str]) -> Optional[str]:
    """The one line a training job ends with when ``exc`` comes from a GPU out of memory."""
    def knobs_of(actor: str) -> list[str]:
        knobs = _knobs(job, actor)
        if job.train.eval.off is None and not actor.startswith("Eval"):
            knobs.append("train.eval.every=-1 (no tau evaluator: it holds a whole target "
                         "beside the training actors)")
        return knobs

    tail = ("no checkpoint of this run was written before it" if kept is None else
            f"kept: checkpoint {kept}, rerun with train.checkpoint.resume=auto to go on from it")
    return gpu_oom_line(exc, knobs_of, tail)
