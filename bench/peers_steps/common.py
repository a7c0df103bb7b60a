"""What the three trainers' runs share: the run context, throughput from step records, and the
choice of the checkpoint that stands for each mark."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from bench.peers_steps.runs import Run
from bench.peers_steps.scale import PeersScale
from bench.real_model_steps import Work


@dataclass
class Ctx:
    """What a run needs: sizes, folders, the data stages' results, the peers' environment."""

    scale: PeersScale
    work: Work
    result: dict  # the data stages' figures: target_folder, train_samples, ...
    peers_env: dict
    peers_missing: Optional[str]  # why the peers cannot run here, None where they can
    device: str

    @property
    def target(self) -> str:
        return self.result["target_folder"]

    def run_dir(self, run: Run) -> Path:
        return self.work.run_dir(run.name)

    def export_dir(self, run: Run, mark: int) -> Path:
        return self.work.path("exports", run.name, f"mark{mark}")

    def target_config(self) -> dict:
        return json.loads(Path(self.target, "config.json").read_text())


@dataclass
class Point:
    """A trainer after an optimizer step: wall time and samples, tokens seen so far."""

    step: int
    time: float
    samples: float
    tokens: float


@dataclass
class Checkpoint:
    """A checkpoint that can stand for a mark: its step and when it was taken."""

    step: int
    time: float  # wall clock when its weights were those of ``step``
    path: Path
    extra: dict = field(default_factory=dict)


def steady_rates(points: list[Point]) -> dict:
    """Samples/s and target tokens/s over the steps after the first quarter (start-up, warm-up
    and compilation stay out of it)."""
    if len(points) < 3:
        return {"samples_per_s": None, "tokens_per_s": None, "steady_steps": 0}
    a, b = points[max(1, len(points) // 4)], points[-1]
    dt = b.time - a.time
    if dt <= 0:
        return {"samples_per_s": None, "tokens_per_s": None, "steady_steps": 0}
    return {"samples_per_s": round((b.samples - a.samples) / dt, 2),
            "tokens_per_s": round((b.tokens - a.tokens) / dt, 1),
            "steady_steps": b.step - a.step, "steady_window_s": round(dt, 2)}


def pick(checkpoints: list[Checkpoint], first_step: float, mark_s: float,
         tolerance_s: float = 1.0) -> Optional[Checkpoint]:
    """The newest checkpoint taken by ``mark_s`` seconds after the first step; where none was,
    the first one after it (a run shorter than its budget, or a coarse checkpoint interval)."""
    if not checkpoints:
        return None
    by_time = sorted(checkpoints, key=lambda c: c.time)
    before = [c for c in by_time if c.time - first_step <= mark_s + tolerance_s]
    return before[-1] if before else by_time[0]
