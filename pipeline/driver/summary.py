"""What a training job did: the driver's run summary, filled in as the job goes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from pipeline.driver.accounting import EpochAccount
from pipeline.driver.eval_tally import EvalTally
from pipeline.driver.recovery import Recovery


@dataclass
class RunSummary:
    first_step: int
    end_step: int
    samples: int
    wall_s: float = 0.0
    losses: list[float] = field(default_factory=list)
    accounts: list[EpochAccount] = field(default_factory=list)
    tau_before: Optional[float] = None
    tau_after: Optional[float] = None
    export_dir: Optional[str] = None
    checkpoints: list[str] = field(default_factory=list)
    on_main_thread: bool = True
    checksums_agree: bool = True
    graph_warned: bool = False
    restarts: list[Recovery] = field(default_factory=list)
    skipped_steps: set[int] = field(default_factory=set)  # steps whose update was not finite
    evals: Optional[EvalTally] = None  # every tau evaluation's outcome (set by the driver)
    nothing_to_train: Optional[str] = None  # why the job trained nothing (it ended at once)

    @property
    def steps(self) -> int:
        return self.end_step - self.first_step
