"""The drafters as one group, and the one place that says which rank runs which call.

With replicated drafters (data parallel, gradients all-reduced) one rank, the *owner*, does
the work that needs one copy of the state: exports, the weights for the tau evaluator.
Checkpoint saves go to every rank in both modes (torch.distributed.checkpoint: each rank
plans, the writing ranks write, the owner reports). :data:`POLICY` declares, per remote method of
:class:`~pipeline.workers.drafter_worker.DrafterWorker` that the driver calls on the group,
how it is dispatched:

- ``Dispatch.OWNER``: the owner rank only (:data:`OWNER_RANK`); its value comes back.
- ``Dispatch.EVERY_RANK``: every rank, in rank order; the owner's value comes back once every
  rank has answered (a rank's failure is raised, never dropped).
- ``Dispatch.EVERY_RANK_AGREED``: every rank; their values must agree, and that value comes
  back (replicas that disagree are a bug: an assertion).
- ``Dispatch.RANK_ZERO``: rank 0 of the process group, whoever the owner is (the rendezvous:
  rank 0 gives the address the others connect to).

The return type of each method is fixed by its signature, not by its mode, so switching a
method between ``OWNER`` and ``EVERY_RANK`` changes nothing at any call site. That is the
switch sharded drafters (FSDP) need: a save through torch.distributed.checkpoint, an export
or a full-weights copy is a collective every rank must enter, and a call sent to the owner
alone would wait in it forever. Such a change edits :data:`POLICY` here, and the worker's
method, and nothing in the driver. A method whose callers need every rank's value (say, a
per-rank save record) is a new method returning a list, not a mode.

Methods that return an ObjectRef say so in their name (``save_checkpoint_ref``,
``weights_ref``): the caller decides when to block. The others block. Every call goes through
a :class:`RemoteCalls` seam, Ray's by default, so the policy can be checked without Ray.
Under Ray a ref sent to every rank is joined by a small task (``ray_start.run_task``), which
holds the owner's value once more (under FSDP, a second copy of the weights in the store); a
rank's failure fails the join, and the driver's recovery finds a dead rank by probing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

import ray

from pipeline.checkpoint.writer import SaveDone
from pipeline.dist.rendezvous import MasterAddress
# The rank that owns the work done once for the group (saves, exports, weights for evals).
from pipeline.driver.join import OWNER_RANK, collected, only_value, owner_value
from pipeline.runtime.ray_start import run_task

# The step loop's lane for calls queued on the owner behind a step (see AfterStepCall).
OWNER_LANE = "drafter owner"


class Dispatch(enum.Enum):
    OWNER = "the owner rank"
    EVERY_RANK = "every rank, the owner's value"
    EVERY_RANK_AGREED = "every rank, one agreed value"
    RANK_ZERO = "rank 0 of the process group"


# Worker method -> how the group dispatches it. The one place to change for sharded drafters.
POLICY: dict[str, Dispatch] = {
    "master_address": Dispatch.RANK_ZERO,
    "startup_seconds": Dispatch.RANK_ZERO,
    "init_group": Dispatch.EVERY_RANK_AGREED,
    "load_checkpoint": Dispatch.EVERY_RANK_AGREED,
    "load_seconds": Dispatch.RANK_ZERO,
    # A save through torch.distributed.checkpoint is entered by every rank (each plans, the
    # writing ranks write); the owner's records cover the whole save.
    "save_checkpoint": Dispatch.EVERY_RANK,
    "wait_saves": Dispatch.EVERY_RANK,
    "weights": Dispatch.OWNER,
    "export": Dispatch.OWNER,
}

# drafter.parallel=fsdp: gathering the full weights is a collective, so weights and exports
# go to every rank; the owner writes (and its value comes back).
FSDP_POLICY: dict[str, Dispatch] = {
    **POLICY, "weights": Dispatch.EVERY_RANK, "export": Dispatch.EVERY_RANK}


def policy_for(parallel: str) -> dict[str, Dispatch]:
    """The dispatch policy of a ``drafter.parallel`` mode."""
    return {"replicate": POLICY, "fsdp": FSDP_POLICY}[parallel]


class RemoteCalls(Protocol):
    """How the group reaches its actors: a call gives a ref; refs are waited for or joined."""

    def call(self, handle: Any, method: str, *args: Any) -> Any: ...

    def get(self, refs: list[Any]) -> list[Any]: ...

    def join(self, refs: list[Any], collect: Callable[[list[Any]], Any]) -> Any:
        """One ref of ``collect(values)``, ready once every ref in ``refs`` is."""
        ...


class RayCalls:
    def call(self, handle: Any, method: str, *args: Any) -> Any:
        return getattr(handle, method).remote(*args)

    def get(self, refs: list[Any]) -> list[Any]:
        return ray.get(refs)

    def join(self, refs: list[Any], collect: Callable[[list[Any]], Any]) -> Any:
        return run_task(collected, collect, *refs)


@dataclass(frozen=True)
class _Agreed:
    method: str

    def __call__(self, values: list[Any]) -> Any:
        assert all(v == values[0] for v in values), \
            f"drafters disagree on {self.method}: {values}"
        return values[0]


class DrafterGroup:
    """The drafter actors of one actor set, called through :data:`POLICY`."""

    def __init__(self, handles: Sequence[Any], policy: dict[str, Dispatch] = POLICY,
                 calls: RemoteCalls = RayCalls()) -> None:
        assert handles, "a drafter group needs at least one drafter"
        self.handles = list(handles)
        self.policy = policy
        self.calls = calls

    # -- set-up -----------------------------------------------------------------------------
    def master_address(self) -> MasterAddress:
        return self._blocking("master_address")

    def startup_seconds(self) -> dict[str, float]:
        """Rank 0's constructor, part by part (its start-up log line)."""
        return self._blocking("startup_seconds")

    def init_group(self, addr: str, port: int, timeout_s: float, write_threads: int = 1) -> None:
        self._blocking("init_group", addr, port, timeout_s, write_threads)

    def load_checkpoint(self, folder: str) -> int:
        """The steps done the checkpoint in ``folder`` holds."""
        return self._blocking("load_checkpoint", folder)

    def load_seconds(self) -> dict[str, float]:
        """Rank 0's last load, part by part (the "resumed from" log line)."""
        return self._blocking("load_seconds")

    # -- outputs ----------------------------------------------------------------------------
    def save_checkpoint_ref(self, folder: str) -> Any:
        """ObjectRef of the seconds the snapshot held training; the write goes on beside."""
        return self._ref("save_checkpoint", folder)

    def wait_saves(self) -> tuple[SaveDone, ...]:
        """Block until no checkpoint write is in flight; the ones not yet handed back."""
        return self._blocking("wait_saves")

    def weights_ref(self, ring: Optional[bool] = False, reader_node: Optional[str] = None) -> Any:
        """ObjectRef of the weights (``workers.weights``: a CPU copy, or a snapshot in rank 0's
        ring; ``DrafterWorker.weights`` says which) as of now in the drafters' queues: behind a
        step, exactly the weights after it."""
        return self._ref("weights", ring, reader_node)

    def export(self, out_dir: str, dtype: str) -> str:
        """Export the drafter to ``out_dir``; its folder."""
        return self._blocking("export", out_dir, dtype)

    # -- dispatch ---------------------------------------------------------------------------
    def _targets(self, method: str) -> tuple[list[Any], Callable[[list[Any]], Any]]:
        """The handles ``method`` goes to, and how their values become the group's."""
        mode = self.policy[method]
        if mode is Dispatch.RANK_ZERO:
            return self.handles[:1], only_value
        if mode is Dispatch.OWNER:
            return [self.handles[OWNER_RANK]], only_value
        if mode is Dispatch.EVERY_RANK:
            return self.handles, owner_value
        assert mode is Dispatch.EVERY_RANK_AGREED, mode
        return self.handles, _Agreed(method)

    def _blocking(self, method: str, *args: Any) -> Any:
        handles, collect = self._targets(method)
        refs = [self.calls.call(h, method, *args) for h in handles]
        return collect(self.calls.get(refs))

    def _ref(self, method: str, *args: Any) -> Any:
        handles, collect = self._targets(method)
        refs = [self.calls.call(h, method, *args) for h in handles]
        # One rank called: its own ref, with no join task between it and the caller.
        return refs[0] if len(refs) == 1 else self.calls.join(refs, collect)
