"""Summing loss parts over micro-batches and ranks, and turning them into logged metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.objective.loss import LossParts


@dataclass
class StepTotals:
    """Sums over a step's micro-batches; plain floats/lists so they cross Ray cheaply."""

    numerator: float = 0.0
    denominator: float = 0.0
    correct: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    samples: int = 0
    tokens: int = 0

    def add_parts(self, parts: LossParts, samples: int, tokens: int) -> None:
        self.numerator += float(parts.numerator.detach())
        self.denominator += float(parts.denominator)
        self._add_counts(parts.correct.tolist(), parts.total.tolist())
        self.samples += samples
        self.tokens += tokens

    def merge(self, other: "StepTotals") -> None:
        self.numerator += other.numerator
        self.denominator += other.denominator
        self._add_counts(other.correct, other.total)
        self.samples += other.samples
        self.tokens += other.tokens

    def _add_counts(self, correct: list[float], total: list[float]) -> None:
        if not self.correct:
            self.correct, self.total = [0.0] * len(correct), [0.0] * len(total)
        self.correct = [a + b for a, b in zip(self.correct, correct)]
        self.total = [a + b for a, b in zip(self.total, total)]

    @property
    def loss(self) -> float:
        return self.numerator / self.denominator if self.denominator else float("nan")

    def position_accuracy(self) -> list[float]:
        """Accuracy per block position k = 1..B-1 (position 0 is never scored)."""
        return [c / t if t else 0.0 for c, t in zip(self.correct[1:], self.total[1:])]

    @property
    def accuracy(self) -> float:
        t = sum(self.total)
        return sum(self.correct) / t if t else 0.0


def expected_acceptance(position_accuracy: list[float]) -> float:
    """tau estimated from per-position accuracies: 1 + sum_k prod_{j<=k} acc_j.

    Treats position k's accuracy as the chance that drafts 1..k are all right given 1..k-1
    were, which is how verification consumes them (a first miss ends the round).
    """
    tau, run = 1.0, 1.0
    for acc in position_accuracy:
        run *= acc
        tau += run
    return tau


def metrics_dict(totals: StepTotals, prefix: str = "train/") -> dict[str, float]:
    pos = totals.position_accuracy()
    out = {f"{prefix}loss": totals.loss, f"{prefix}accuracy": totals.accuracy,
           f"{prefix}expected_tau": expected_acceptance(pos)}
    out.update({f"{prefix}accuracy_pos{k + 1:02d}": a for k, a in enumerate(pos)})
    return out
