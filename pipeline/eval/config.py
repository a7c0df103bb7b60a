"""``train.eval``: tau (acceptance length) on held-out prompts, before, during and after."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pipeline.validate import require


@dataclass
class EvalConfig:
    # Every N steps (0: only before and after training; -1: never).
    every: int = 0
    prompts: int = 16
    max_new_tokens: int = 64
    # The evaluator is an actor of its own (it holds a full target). On CUDA it takes this
    # fraction of a GPU; the cluster preset must leave that much free beside its groups.
    gpus: float = 0.1

    def __post_init__(self) -> None:
        require(self.every >= -1, "train.eval.every", self.every, ">= -1")
        require(self.prompts >= 0, "train.eval.prompts", self.prompts, ">= 0 (0: no eval)")
        # The first new token is the target's own: with one, no drafting round runs and no
        # tau can come out.
        require(self.max_new_tokens >= 2, "train.eval.max_new_tokens", self.max_new_tokens,
                ">= 2 (the first new token is the target's own; tau needs a drafting round)")
        require(0 < self.gpus <= 1, "train.eval.gpus", self.gpus,
                "in (0, 1]: a fraction of a GPU beside the training actors")

    @property
    def off(self) -> Optional[str]:
        """The setting that turns tau evaluation off, or None when it is on."""
        if self.every < 0:
            return f"train.eval.every={self.every}"
        if self.prompts == 0:
            return "train.eval.prompts=0"
        return None
