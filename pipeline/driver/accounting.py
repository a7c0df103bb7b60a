"""Exact sample accounting: every sample of an epoch is trained exactly once, and we prove it.

After a lost actor the job resumes from its last checkpoint, and the steps trained after that
checkpoint are trained again. Their first training died with the actors' state, so the
accounting rolls back to the checkpoint too, and counts those samples as ``redone``.
"""

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
    redone: int = 0  # samples trained again after a restart (their first pass was lost)
    restarts: int = 0

    @property
    def exact(self) -> bool:
        return not self.missing and not self.repeated and self.trained == self.expected

    def summary(self) -> str:
        cut = "" if self.complete else " (epoch cut by train.plan.max_steps)"
        redo = (f"; across {self.restarts} restart(s), {self.redone} samples trained after "
                f"the last checkpoint were lost and trained again" if self.restarts else "")
        return (f"epoch {self.epoch}: {self.trained}/{self.expected} planned samples trained, "
                f"{len(self.missing)} missing, {len(self.repeated)} repeated{cut}{redo}")


class SampleAccounting:
    def __init__(self, sample_ids: Sequence[int]) -> None:
        self.expected = frozenset(sample_ids)
        self.seen: dict[int, list[tuple[int, Sequence[int]]]] = defaultdict(list)  # (step, ids)
        self.redone: Counter = Counter()  # epoch -> samples rolled back
        self.restarts = 0

    def add(self, epoch: int, sample_ids: Sequence[int], step: int = -1) -> None:
        unknown = set(sample_ids) - self.expected
        assert not unknown, f"trained sample ids {sorted(unknown)[:5]} that the data never had"
        self.seen[epoch].append((step, tuple(sample_ids)))

    def rollback(self, step: int) -> None:
        """Forget what steps >= ``step`` trained: a restart resumes from there."""
        self.restarts += 1
        for epoch, records in self.seen.items():
            keep = [(s, ids) for s, ids in records if s < step]
            self.redone[epoch] += sum(len(ids) for s, ids in records if s >= step)
            self.seen[epoch] = keep

    def account(self, epoch: int, planned: int) -> EpochAccount:
        counts = Counter(i for _, ids in self.seen[epoch] for i in ids)
        complete = planned == len(self.expected)
        missing = self.expected - counts.keys() if complete else set()
        return EpochAccount(
            epoch=epoch, expected=planned, trained=sum(counts.values()),
            missing=tuple(sorted(missing)),
            repeated=tuple(sorted(i for i, c in counts.items() if c > 1)), complete=complete,
            redone=self.redone[epoch], restarts=self.restarts)
