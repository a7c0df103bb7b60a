"""Python's cyclic garbage collector while a process of ours starts.

Importing torch (with dynamo), transformers and Ray makes some 360k tracked objects. Under the
default thresholds Python runs six full collections meanwhile, each a walk over every object
made so far, though none of it is garbage: 0.8 CPU-s of a 3.5 CPU-s start-up with CPU torch
(Python 3.11, the developers' machine), 0.34 of 9.6 with CUDA torch (Python 3.12, an H100),
2026-12-06, measured by a probe since retired (docs/BENCHMARKS.md). Every actor pays it, on
every start and restart, and the CPU test suite starts about 240 of them on 2 cores.

So a process we start defers full collections (the young generations are still collected)
until :func:`started`, which puts Python's thresholds back: the first full collection then
comes soon after, once, and frees whatever start-up left in cycles. Nothing is frozen
(``gc.freeze``): an object built during start-up and dropped later (an evaluator's drafter
copy, a load's host buffers) must stay collectable.

Actors: the driver sets :data:`ENV_VAR` in their environment (``pipeline.runtime.ray_start.actor_env``);
``pipeline/__init__`` reads it, before any module of ours imports torch, and the actor's
constructor calls :func:`started` once it returns. Our command-line entry points call both
themselves.
"""

from __future__ import annotations

import gc
import os
from typing import Optional

ENV_VAR = "DFLASH_DEFER_FULL_GC"
# A full collection runs after this many collections of the middle generation: never, here.
_NEVER = 1 << 30
_saved: Optional[tuple[int, int, int]] = None


def defer_full_collections() -> None:
    """Until :func:`started`, no full collection (young ones go on as before)."""
    global _saved
    if _saved is None:
        _saved = gc.get_threshold()
        gc.set_threshold(_saved[0], _saved[1], _NEVER)


def defer_if_asked() -> None:
    """:func:`defer_full_collections` where our launcher asked for it (:data:`ENV_VAR`), and
    the variable removed so that no process this one starts inherits it."""
    if os.environ.pop(ENV_VAR, None) == "1":
        defer_full_collections()


def started() -> None:
    """Start-up is over: full collections as before. Nothing where they were not deferred."""
    global _saved
    if _saved is None:
        return
    gc.set_threshold(*_saved)
    _saved = None
