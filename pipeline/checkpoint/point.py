"""Where training continues after a checkpoint: what its state.json records beside the files."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResumePoint:
    """Where training continues: the next global step, and the data cursor."""

    step: int             # optimizer steps already taken
    epoch: int            # epoch the next sample comes from
    samples_done: int     # samples of that epoch already trained
