"""Where the data cursor stands after each planned step: what a checkpoint records."""

from __future__ import annotations

from typing import Optional, Protocol, Sequence

from pipeline.checkpoint.point import ResumePoint


class PlannedSteps(Protocol):
    """What the cursor reads of a job's plan (workers/prefetcher.py's PlanSummary)."""

    @property
    def num_samples(self) -> int: ...

    @property
    def first_step(self) -> int: ...

    @property
    def end_step(self) -> int: ...

    @property
    def step_epochs(self) -> Sequence[int]: ...

    @property
    def step_samples(self) -> Sequence[int]: ...


class Cursor:
    """The data cursor after each planned step: (epoch, samples of it done)."""

    def __init__(self, plan: PlannedSteps, resume: Optional[ResumePoint]) -> None:
        self.plan = plan
        self.num_samples = plan.num_samples
        start = resume.samples_done if resume else 0
        self.points: dict[int, ResumePoint] = {}
        done: dict[int, int] = {}
        for i, (epoch, n) in enumerate(zip(plan.step_epochs, plan.step_samples)):
            first = resume is not None and epoch == resume.epoch
            done[epoch] = done.get(epoch, start if first else 0) + n
            step = plan.first_step + i
            if done[epoch] >= self.num_samples:
                self.points[step] = ResumePoint(step + 1, epoch + 1, 0)
            else:
                self.points[step] = ResumePoint(step + 1, epoch, done[epoch])

    def after(self, step: int) -> ResumePoint:
        return self.points[step]

    def epoch_ends_at(self, step: int) -> bool:
        """The last planned step of its epoch (complete, or cut by max_steps)."""
        i = step - self.plan.first_step
        epochs = self.plan.step_epochs
        return i == len(epochs) - 1 or epochs[i + 1] != epochs[i]
