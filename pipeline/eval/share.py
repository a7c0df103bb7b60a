"""How much of its GPU the evaluator takes beside training (train.eval.stream_priority,
train.eval.gpu_duty; both act on CUDA only).

- Its kernels go to a stream of the lowest priority the device has. PyTorch's default is
  already the lowest (0; higher priorities are negative), so this only ever helps against
  streams of the same process that ask for more; it is no lever across processes.
- Its duty is capped: after each decoding round it waits for its kernels, then sleeps until
  the time it kept the GPU busy is at most ``gpu_duty`` of the wall time. Training kernels from
  another process (no priority reaches across processes) get the rest.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

import torch

from pipeline.eval.config import DecodeOptions


_LOWEST = 1 << 10


class Pacer:
    """Called after each unit of work: sleeps to keep the busy share at ``duty``."""

    def __init__(self, device: torch.device, duty: float,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.cuda = device.type == "cuda"
        self.duty = duty
        self.sleep = sleep
        self.mark = time.perf_counter()
        self.slept = 0.0

    def __call__(self) -> None:
        if not self.cuda or self.duty >= 1.0:
            return
        torch.cuda.current_stream().synchronize()
        now = time.perf_counter()
        rest = (now - self.mark) * (1.0 / self.duty - 1.0)
        self.sleep(rest)
        self.slept += rest
        self.mark = time.perf_counter()


@contextlib.contextmanager
def evaluator_stream(device: torch.device, options: DecodeOptions) -> Iterator[None]:
    """The block runs on a lowest-priority CUDA stream (``stream_priority="low"`` on CUDA)."""
    if device.type != "cuda" or options.stream_priority == "default":
        yield
        return
    # Lower numbers are higher priorities; a value past the device's range is mapped to the
    # nearest valid one, so a large positive number asks for the lowest.
    stream = torch.cuda.Stream(device=device, priority=_LOWEST)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream(device).wait_stream(stream)
