"""What the driver needs to survive a lost actor, and to stop cleanly on a blown-up loss.

A killed actor shows up as a ``RayActorError`` on one of the step loop's pending refs. Its
peers may fail first and differently: a drafter in the all-reduce sees its peer's socket close
and raises a plain task error. So on any Ray error the driver looks a little longer at what
is still pending for the actor that died, and restarts only when it finds one; any other
error is a bug and ends the job as before.

The tau evaluator is not part of the training set: its calls carry their own error handler
(AfterStepCall.on_error), so they are not among the loop's pending refs, and its death is
the evaluator's to handle (pipeline/driver/evaluator.py), never a restart of the set.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import ray
from ray.exceptions import RayActorError, RayError

log = logging.getLogger(__name__)


@dataclass
class Recovery:
    """One restart: what died, when the driver saw it, and where training went on."""

    actor: str
    detected_at: float            # time.time() when the driver saw the loss
    resumed_step: int             # steps done by the checkpoint training resumed from
    checkpoint: Optional[str]     # None: no checkpoint yet, the job started over
    restarted_at: float = 0.0     # the new actor set is up and loaded
    training_at: float = 0.0      # the first step after the restart completed
    # Seconds of the restart's parts, in order (the actors, the checkpoint's load), to tell
    # where a slow restart spends its time.
    phases: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.detected_at))
        return (f"lost {self.actor} at {when}; resuming from step {self.resumed_step} "
                f"({self.checkpoint or 'no checkpoint yet: from the start'})")


class NonFiniteError(RuntimeError):
    """Too many non-finite steps in a row: the job stops (after saving its last good state)."""


def lost_actor(error: BaseException, pending: Iterable[Any], names: dict[str, str],
               actors: Iterable[Any] = (), grace_s: float = 10.0) -> Optional[str]:
    """The name of the actor that died, if ``error``, a pending ref or a probe says one did.

    The dead actor may have had nothing pending, so every actor in ``actors`` is also probed
    with a no-op call; a dead one fails it at once.
    """
    if isinstance(error, RayActorError):
        return _name(error, names)
    if not isinstance(error, RayError):
        return None
    waiting = list(pending) + [a.__ray_ready__.remote() for a in actors]
    deadline = time.monotonic() + grace_s
    while waiting and time.monotonic() < deadline:
        done, waiting = ray.wait(waiting, num_returns=1, timeout=deadline - time.monotonic())
        for ref in done:
            try:
                ray.get(ref)
            except RayActorError as died:
                return _name(died, names)
            except RayError:
                continue
    return None


def _name(error: RayActorError, names: dict[str, str]) -> str:
    actor_id = getattr(error, "actor_id", None)
    return names.get(actor_id or "", f"actor {actor_id or '(unknown id)'}")
