"""Small helpers every worker uses."""

from __future__ import annotations

import threading
import time

import torch


def on_main_thread() -> bool:
    """True when called on the process's main thread (where CUDA graph state lives)."""
    return threading.current_thread() is threading.main_thread()


def actor_device(kind: str) -> torch.device:
    """The device a worker computes on: Ray shows each GPU actor only its own GPU, as cuda:0."""
    if kind == "cuda":
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except ImportError:  # pragma: no cover - non-POSIX
        return 0


class StartupClock:
    """A worker constructor's parts, in seconds, each part from the previous mark (or the
    constructor's first line) to its own."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, part: str) -> None:
        now = time.perf_counter()
        self.parts[part] = now - self._last
        self._last = now

    def carve(self, part: str, share: str, seconds: float) -> None:
        """``seconds`` of ``part`` given their own name, right after it: the parts still add
        up to the whole."""
        seconds = min(max(seconds, 0.0), self.parts[part])
        self.parts[part] -= seconds
        self.parts[share] = seconds
