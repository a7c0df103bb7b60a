"""A fixed-shape step captured once as a CUDA graph and replayed (the batched evaluator's
verify and draft steps, gpt-fast style).

The step's tensor inputs are copied into buffers the graph was captured with, the graph is
replayed, and its outputs (the same tensors every replay) are returned: a caller reads them
before the next call. Warm-up runs (eager, before capture) may change state the step mutates
(a static cache's write offset); ``restore`` puts it back. A step that cannot be captured (a
host sync inside: MoE routing that counts tokens per expert) runs eagerly from then on, said
once in the log.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Union

import torch

log = logging.getLogger(__name__)

Inputs = Union[torch.Tensor, dict[str, torch.Tensor]]


def _leaves(x: Inputs) -> list[torch.Tensor]:
    return list(x.values()) if isinstance(x, dict) else [x]


class CapturedStep:
    """``fn(*inputs)`` with fixed input shapes, as a CUDA graph after its first call."""

    def __init__(self, fn: Callable[..., Any], name: str,
                 snapshot: Optional[Callable[[], Any]] = None,
                 restore: Optional[Callable[[Any], None]] = None) -> None:
        self.fn, self.name = fn, name
        self.snapshot, self.restore = snapshot, restore
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.static: Optional[tuple[Inputs, ...]] = None
        self.out: Any = None
        self.eager = False

    def __call__(self, *inputs: Inputs) -> Any:
        if self.eager:
            return self.fn(*inputs)
        if self.graph is None:
            try:
                self._capture(inputs)
            except Exception as e:  # the step has a host sync or an uncapturable op
                log.info("tau: the %s step runs without a CUDA graph (capture failed: %s: %s)",
                         self.name, type(e).__name__, " ".join(str(e).split())[:200])
                self.graph, self.eager = None, True
                return self.fn(*inputs)
        for buf, x in zip(self.static, inputs):
            for b, v in zip(_leaves(buf), _leaves(x)):
                b.copy_(v)
        self.graph.replay()
        return self.out

    def _capture(self, inputs: tuple[Inputs, ...]) -> None:
        self.static = tuple({k: v.clone() for k, v in x.items()} if isinstance(x, dict)
                            else x.clone() for x in inputs)
        state = self.snapshot() if self.snapshot else None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # kernels pick their algorithms, allocators their blocks
                self.fn(*self.static)
        torch.cuda.current_stream().wait_stream(side)
        if self.restore:
            self.restore(state)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.out = self.fn(*self.static)
        finally:
            if self.restore:
                self.restore(state)
        self.graph = graph
