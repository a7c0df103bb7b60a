"""What a trainer left behind: its ``metrics.jsonl`` rows and the tau figures of its log.

``pipeline.train`` logs ``eval/tau`` rows (before, every ``train.eval_every`` steps, after)
and a closing ``summary`` row. ``pipeline.train_single`` logs no tau rows: its tau before and
after training are read from its closing log line, and placed at step 0 and the last step.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

_SINGLE_DONE = re.compile(r"done: (\d+) steps, .* tau (\S+) -> (\S+)")


@dataclass
class Curves:
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    expected_tau: list[float] = field(default_factory=list)
    position_accuracy: list[list[float]] = field(default_factory=list)  # per step, k=1..B-1
    tau_steps: list[int] = field(default_factory=list)
    tau: list[float] = field(default_factory=list)

    @property
    def final_tau(self) -> Optional[float]:
        return self.tau[-1] if self.tau else None

    def final_position_accuracy(self, last: int = 20) -> list[float]:
        """Mean over the last ``last`` steps: one step's counts are noisy."""
        rows = self.position_accuracy[-last:]
        if not rows:
            return []
        return [sum(r[k] for r in rows) / len(rows) for k in range(len(rows[0]))]

    def to_json(self) -> dict:
        return {"steps": self.steps, "loss": self.loss, "accuracy": self.accuracy,
                "expected_tau": self.expected_tau,
                "position_accuracy": self.position_accuracy,
                "tau_steps": self.tau_steps, "tau": self.tau}


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut short by a stopped run
    return rows


def _add_train_row(curves: Curves, row: dict) -> None:
    curves.steps.append(int(row["step"]))
    curves.loss.append(float(row["train/loss"]))
    curves.accuracy.append(float(row["train/accuracy"]))
    curves.expected_tau.append(float(row["train/expected_tau"]))
    keys = sorted(k for k in row if k.startswith("train/accuracy_pos"))
    curves.position_accuracy.append([float(row[k]) for k in keys])


def read_pipeline(out_dir: Path) -> Curves:
    curves = Curves()
    for row in _rows(out_dir / "metrics.jsonl"):
        if "eval/tau" in row:
            curves.tau_steps.append(int(row["step"]))
            curves.tau.append(float(row["eval/tau"]))
        elif "train/loss" in row:
            _add_train_row(curves, row)
    return curves


def read_single(out_dir: Path, log_path: Path) -> Curves:
    curves = Curves()
    points = []  # (step, tau): between steps from metrics.jsonl, before and after from the log
    for row in _rows(out_dir / "metrics.jsonl"):
        if "eval/tau" in row:
            points.append((int(row["step"]), float(row["eval/tau"])))
        elif "train/loss" in row:
            _add_train_row(curves, row)
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    match = _SINGLE_DONE.search(text)
    if match:
        steps, before, after = int(match.group(1)), _num(match.group(2)), _num(match.group(3))
        points += [(step, tau) for step, tau in ((0, before), (steps, after)) if tau is not None]
    for step, tau in sorted(points):
        curves.tau_steps.append(step)
        curves.tau.append(tau)
    return curves


def _num(text: str) -> Optional[float]:
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value
