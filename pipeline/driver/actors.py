"""The job's actor group: a prefetcher, and per node its targets and drafters, wired together.

Life cycle: :meth:`ActorGroup.start` (the prefetcher first, since its plan sizes the
schedules; then one placement group per node with its targets and drafters),
:meth:`~ActorGroup.rendezvous` (the drafters' process group; each ring opened by the drafters
of its node), :meth:`~ActorGroup.close` (rings closed readers first, actors killed, placement
groups removed). As a context manager the group starts on entry and closes on exit, also when
entry fails half way, so nothing that was started outlives an error. :meth:`~ActorGroup.restart`
closes and starts the whole set again from a resume point.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Optional

import ray

from pipeline.runtime import stop_signals
from pipeline.job.assembly import batch_shapes, packing_of
from pipeline.checkpoint.point import ResumePoint
from pipeline.job.config import JobConfig, reads_ahead
from pipeline.data import ChatDataset
from pipeline.data.batching import BatchShapes
from pipeline.driver.drafter_group import DrafterGroup, policy_for
from pipeline.driver.launcher import NodeGroup, node_groups, release_groups, remove_groups
from pipeline.driver.placement import wait_placed
from pipeline.driver.scheduler import Topology
from pipeline.driver.staged import chain_names, connect_stages, start_stages
from pipeline.model.config import feature_width
from pipeline.runtime.actor_pool import release_actors
from pipeline.runtime.ray_start import Placement, kill_actors, start_actor
from pipeline.job.resolve import ResolvedJob
from pipeline.transport.shared import remove_dead_manager_folders
from pipeline.workers.drafter_worker import DrafterWorker
from pipeline.workers.prefetcher import PlanSummary, Prefetcher
from pipeline.workers.target_worker import TargetWorker

log = logging.getLogger(__name__)

# What a layer of actors still gets once an interrupted job's grace is spent: an actor with
# nothing queued closes in it (a target unlinks its ring's shared memory, which a kill leaves).
_LEAST_WAIT_S = 2.0


class ActorGroup:
    def __init__(self, job: JobConfig, resolved: ResolvedJob, dataset: ChatDataset,
                 resume: Optional[ResumePoint] = None,
                 checkpoint: Optional[Path] = None) -> None:
        """``checkpoint``: the folder ``resume`` comes from, which the driver loads into the
        drafters once they are up; they read it ahead while they start."""
        self.job = job
        self.r = resolved
        self.resume = resume
        self.checkpoint = checkpoint
        # The driver's encoded training set, put in the object store on the first start and
        # handed to every prefetcher this group starts: none reads or encodes the file again.
        self._dataset = dataset
        self._dataset_ref: Any = None
        # Seconds of the last start's or restart's parts, by name, for the restart's log line.
        self.phases: dict[str, float] = {}
        self._drafters_asked_at = 0.0  # when the last start's rank 0 was asked for
        self._clear()

    def _clear(self) -> None:
        self.prefetcher: Any = None
        self.targets: list[Any] = []  # a staged target's last stage (it owns the tap ring)
        self.chains: list[list[Any]] = []  # every target's actors, stage 0 first
        self.drafters: list[Any] = []
        self.target_node: list[int] = []  # node index of each target
        self.drafter_node: list[int] = []  # node index of each drafter
        self.groups: list[NodeGroup] = []
        self.plan: Optional[PlanSummary] = None

    # -- life cycle -------------------------------------------------------------------------
    def __enter__(self) -> "ActorGroup":
        try:
            self.start()
            self.rendezvous()
        except BaseException as exc:
            self.close(grace_s=stop_signals.grace_for(type(exc)))
            raise
        return self

    def __exit__(self, exc_type: Optional[type], *exc: Any) -> None:
        self.close(grace_s=stop_signals.grace_for(exc_type))

    def start(self) -> PlanSummary:
        """Every actor started and recorded as it starts, so close() finds each one."""
        assert self.prefetcher is None, "start() on a started group: close() or restart()"
        self.prefetcher = self._start_prefetcher()
        # The first actor: where the cluster's CPUs are held by others, the wait says so.
        wait_placed(self.prefetcher.__ray_ready__.remote(),
                    f"the prefetcher (CPU: {self.job.cluster.cpus_per_actor:g}) to start",
                    self.job.cluster.placement_timeout_s)
        self.plan = plan = ray.get(self.prefetcher.summary.remote())
        log.info("plan: %d samples; steps %d..%d of %d micro-batches", plan.num_samples,
                 plan.first_step + 1, plan.end_step, self.micro_batches_per_step)
        self.groups = node_groups(self.job.cluster, self.r.device, stages=self.stages)
        for n, group in enumerate(self.groups):
            self._start_node(n, group, plan)
        return plan

    def rendezvous(self) -> None:
        """Form the drafters' process group and open every ring in the drafters of its node.
        Its two parts' seconds go to :attr:`phases` (a restart's log line says them)."""
        group = self.drafter_group
        t0 = time.perf_counter()
        master = group.master_address()  # rank 0's first call: after its constructor
        t1 = time.perf_counter()
        self._log_drafter_startup(t1)
        group.init_group(master.addr, master.port, self.job.cluster.collective_timeout_s,
                         self.job.train.checkpoint.write_threads)
        connect_stages(self.chains)
        handles = ray.get([t.ring_handle.remote() for t in self.targets])
        ray.get([d.attach.remote([h for h, n in zip(handles, self.target_node)
                                  if n == self.drafter_node[i]])
                 for i, d in enumerate(self.drafters)])
        self.phases.update({"drafters built": t1 - t0,
                            "process group and rings": time.perf_counter() - t1})

    def _log_drafter_startup(self, up_at: float) -> None:
        """Where drafter rank 0's start-up went: before its constructor (a Ray worker for it,
        the interpreter and the imports: what a process kept warm would save), then the
        constructor's own parts."""
        up = up_at - self._drafters_asked_at
        inside = self.drafter_group.startup_seconds()
        parts = {"before its constructor": max(0.0, up - sum(inside.values())), **inside}
        log.info("drafter rank 0 up %.1fs after it was asked for (%s)", up,
                 ", ".join(f"{k} {v:.1f}s" for k, v in parts.items()))

    def close(self, after_failure: bool = False, grace_s: Optional[float] = None) -> None:
        """Close rings (readers first), kill the actors, free the placement groups.

        Closing before killing matters on CPU: a killed owner leaves its /dev/shm segment
        behind. Safe to call on a group that is partly started, or already closed. After a
        lost actor the surviving drafters may sit in a collective that never completes, so
        they are killed at once (readers need no close); the targets still close their rings.

        ``grace_s`` (a stopped job: stop_signals.GRACE_S) bounds the closing in all: an actor
        closes behind the calls queued on it (a drafter behind its checkpoint write), and
        three layers at a minute each outlast `ray job stop`'s SIGKILL. Once it is spent, a
        layer gets :data:`_LEAST_WAIT_S`; whatever has not closed by then is killed.
        """
        if after_failure:
            kill_actors(self.drafters)
        # A stage before the last holds views of its neighbours' rings: it closes first.
        upstream = [h for chain in self.chains for h in chain[:-1]]
        order = [upstream, self.targets] if after_failure else \
            [self.drafters, upstream, self.targets]
        deadline = None if grace_s is None else time.monotonic() + grace_s
        closed = set()
        for handles in order:
            closed |= self._close_each(handles, _within(10.0 if after_failure else 60.0,
                                                        deadline))
        clean = not after_failure and grace_s is None and self.prefetcher is not None
        everyone = self.handles()
        if clean and all(h._actor_id.hex() in closed for h in everyone
                         if h is not self.prefetcher):
            release_actors(everyone)
            release_groups(self.groups, self.job.cluster, self.r.device, self.stages)
        else:
            kill_actors(everyone)
            remove_groups(self.groups)
        self._clear()
        remove_dead_manager_folders()  # of actors killed before their close, now or earlier

    def restart(self, resume: Optional[ResumePoint], after_failure: bool = False,
                checkpoint: Optional[Path] = None) -> PlanSummary:
        """The whole set again, planning from ``resume``; load its ``checkpoint`` after this."""
        t0 = time.perf_counter()
        self.close(after_failure)
        self.resume, self.checkpoint = resume, checkpoint
        try:
            plan = self.start()
            self.phases = {"actor set closed and started": time.perf_counter() - t0}
            self.rendezvous()
        except BaseException as exc:
            self.close(grace_s=stop_signals.grace_for(type(exc)))
            raise
        return plan

    def restart_after_loss(self, lost: str, resume: Optional[ResumePoint],
                           checkpoint: Optional[Path] = None) -> PlanSummary:
        """Restart what a lost actor takes down; load ``checkpoint`` (``resume``'s) after this.

        A lost drafter restarts the drafters only: the survivors may sit in an all-reduce that
        never completes and the process group must be formed again, but the targets (the
        slowest to load) and their rings are intact, and the prefetcher only re-plans from
        ``resume``. A lost target or prefetcher restarts the whole set: a ring whose producer
        died must never be read again.
        """
        self.phases = {}
        if lost not in self.drafter_names():
            return self.restart(resume, after_failure=True, checkpoint=checkpoint)
        t0 = time.perf_counter()
        kill_actors(self.drafters)
        self.drafters, self.drafter_node = [], []
        self.resume, self.checkpoint = resume, checkpoint
        try:
            self.plan = plan = ray.get(self.prefetcher.replan.remote(resume))
            self.phases["drafters killed and data re-planned"] = time.perf_counter() - t0
            for n, group in enumerate(self.groups):
                self._start_drafters(n, group, plan)
            self.rendezvous()
        except BaseException as exc:
            self.close(grace_s=stop_signals.grace_for(type(exc)))
            raise
        return plan

    def drafter_names(self) -> set[str]:
        ids = {h._actor_id.hex() for h in self.drafters}
        return {name for actor_id, name in self.names().items() if actor_id in ids}

    @staticmethod
    def _close_each(handles: list[Any], timeout_s: float) -> set[str]:
        """Close ``handles``; the actor ids of those that closed."""
        refs = [h.close.remote() for h in handles]
        if not refs:
            return set()
        owner = {ref.hex(): h._actor_id.hex() for ref, h in zip(refs, handles)}
        closed = set()
        ready, stuck = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for ref in ready:
            try:
                ray.get(ref)
                closed.add(owner[ref.hex()])
            except Exception as exc:  # a crashed actor must not hide the original error
                log.warning("closing an actor failed: %s", exc)
        if stuck:
            log.warning("%d actor(s) did not close within %.0fs; killing them", len(stuck),
                        timeout_s)
        return closed

    def handles(self) -> list[Any]:
        stages = [h for chain in self.chains for h in chain]
        return [h for h in (self.prefetcher, *stages, *self.drafters) if h is not None]

    def names(self) -> dict[str, str]:
        """Actor id (hex) -> a name for the log: "drafter 1 (node 0)"."""
        named = {"prefetcher": [self.prefetcher] if self.prefetcher is not None else []}
        named.update(target=self.targets, drafter=self.drafters)
        nodes = {"target": self.target_node, "drafter": self.drafter_node}
        out = {}
        for kind, handles in named.items():
            for i, h in enumerate(handles):
                where = f" (node {nodes[kind][i]})" if kind in nodes else ""
                out[h._actor_id.hex()] = f"{kind} {i}{where}" if kind in nodes else kind
        return {**out, **chain_names(self.chains, self.target_node)}

    # -- what the driver uses ---------------------------------------------------------------
    def load_checkpoint(self, folder: str) -> int:
        """Every drafter loads ``folder``; returns the steps done it holds."""
        return self.drafter_group.load_checkpoint(folder)

    @property
    def drafter_group(self) -> DrafterGroup:
        """The drafters as one group: which rank runs which call is declared there."""
        return DrafterGroup(self.drafters, policy_for(self.job.drafter.parallel))

    def topology(self) -> Topology:
        return Topology(self.prefetcher, self.targets, self.drafters, self.target_node,
                        self.drafter_node, self.job.cluster.num_slots, self.chains)

    @property
    def stages(self) -> int:
        return self.job.target.stages

    @property
    def micro_batches_per_step(self) -> int:
        return self.job.cluster.num_drafters * self.job.train.plan.grad_accum

    @property
    def _shapes(self) -> BatchShapes:
        return batch_shapes(self.job)

    @property
    def _slot_numel(self) -> int:
        """A slot holds the largest micro-batch's features: [rows, length, taps*H] (one H more
        when distilling: feature_width), where rows x length is micro_batch x max_length
        padded, and at most the token budget bucketed."""
        tokens = self._shapes.max_tokens(self.job.data.max_length)
        return tokens * feature_width(self.r.spec, self.job.drafter)

    @property
    def _act_numel(self) -> int:
        """A staged target's activation slot: [rows, length, H] of the largest micro-batch."""
        return self._shapes.max_tokens(self.job.data.max_length) * self.r.spec.hidden_size

    # -- starting ---------------------------------------------------------------------------
    def _start_prefetcher(self) -> Any:
        job, r, plan = self.job, self.r, self.job.train.plan
        if self._dataset_ref is None:
            self._dataset_ref = ray.put(self._dataset)
        return start_actor(
            Prefetcher, Placement(cpus=job.cluster.cpus_per_actor),
            dataset=self._dataset_ref, data=job.data, epochs=plan.epochs,
            micro_batches_per_step=self.micro_batches_per_step, max_steps=plan.max_steps,
            pad_token_id=r.pad_token_id,
            shapes=self._shapes,
            resume=self.resume)

    def _start_node(self, n: int, group: NodeGroup, plan: PlanSummary) -> None:
        """Node ``n``'s targets (bundles first) and drafters; ranks are node-contiguous."""
        r, c, k = self.r, self.job.cluster, self.stages
        for i in range(c.targets_per_node):
            args = dict(rank=len(self.targets), target_path=r.target_path,
                        tap_ids=r.spec.target_layer_ids, device=r.device, dtype=r.target_dtype,
                        num_slots=c.num_slots, slot_numel=self._slot_numel,
                        node_id=group.node_id, compile=self.job.target.compile)
            # Target i's stages take bundles i*k .. i*k+k-1 (start_actor does not block).
            chain = [start_actor(TargetWorker, group.placement(i), **args,
                                 final_hidden=self.job.drafter.distills)] if k == 1 else \
                start_stages(lambda s: group.placement(i * k + s), k,
                             act_numel=self._act_numel, **args)
            self.chains.append(chain)
            self.targets.append(chain[-1])
            self.target_node.append(n)
        self._start_drafters(n, group, plan)

    def _start_drafters(self, n: int, group: NodeGroup, plan: PlanSummary) -> None:
        job, r, c = self.job, self.r, self.job.cluster
        if n == 0:
            self._drafters_asked_at = time.perf_counter()
        for i in range(c.drafters_per_node):
            rank = n * c.drafters_per_node + i
            self.drafters.append(start_actor(
                DrafterWorker, group.placement(c.targets_per_node * self.stages + i),
                rank=rank, world_size=c.num_drafters, spec=r.spec,
                options=job.drafter, optim=job.train.optim, seed=job.train.seed,
                target_path=r.target_path, device=r.device, autocast_dtype=r.autocast_dtype,
                feature_dtype=r.target_dtype, feature_numel=self._slot_numel,
                total_steps=plan.end_step, packing=packing_of(job),
                checkpoint=self._read_ahead()))
            self.drafter_node.append(n)

    def _read_ahead(self) -> Optional[str]:
        """The checkpoint the drafters will load, for them to read while they start
        (train.checkpoint.read_ahead)."""
        if self.checkpoint is None or not reads_ahead(self.job):
            return None
        return str(self.checkpoint)


def _within(limit_s: float, deadline: Optional[float]) -> float:
    """A layer's wait: its own limit, and no more than what is left before ``deadline`` (but
    :data:`_LEAST_WAIT_S`); None: no deadline."""
    if deadline is None:
        return limit_s
    return min(limit_s, max(_LEAST_WAIT_S, deadline - time.monotonic()))
