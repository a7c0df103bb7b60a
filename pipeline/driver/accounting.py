"""Exact sample accounting: every sample of an epoch is trained exactly once, and we prove it."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class EpochAccount:
    epoch: int
    expected: int   # samples planned for this epoch (all of them unless max_steps cut it)
    trained: int
    missing: tuple[int, ...]  # only known for a complete epoch
    repeated: tuple[int, ...]
    complete: bool

    @property
    def exact(self) -> bool:
        return not self.missing and not self.repeated and self.trained == self.expected

    def summary(self) -> str:
        cut = "" if self.complete else " (epoch cut by train.plan.max_steps)"
        return (f"epoch {self.epoch}: {self.trained}/{self.expected} planned samples trained, "
                f"{len(self.missing)} missing, {len(self.repeated)} repeated{cut}")


class SampleAccounting:
    def __init__(self, sample_ids: Sequence[int]) -> None:
        self.expected = frozenset(sample_ids)
        self.seen: dict[int, Counter] = defaultdict(Counter)

    def add(self, epoch: int, sample_ids: Sequence[int]) -> None:
        unknown = set(sample_ids) - self.expected
        assert not unknown, f"trained sample ids {sorted(unknown)[:5]} that the data never had"
        self.seen[epoch].update(sample_ids)

    def account(self, epoch: int, planned: int) -> EpochAccount:
        counts = self.seen[epoch]
        complete = planned == len(self.expected)
        missing = self.expected - counts.keys() if complete else set()
        return EpochAccount(
            epoch=epoch, expected=planned, trained=sum(counts.values()),
            missing=tuple(sorted(missing)),
            repeated=tuple(sorted(i for i, c in counts.items() if c > 1)), complete=complete)
