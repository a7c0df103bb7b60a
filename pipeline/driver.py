"""The driver: resolves the job, starts the actors, runs the step loop, exports and evaluates."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import ray

from pipeline.accounting import EpochAccount, SampleAccounting
from pipeline.config import JobConfig
from pipeline.launcher import NodeGroup, check_cluster, node_groups, start_actor
from pipeline.resolve import ResolvedJob, resolve_job
from pipeline.scheduler import StepLoop, StepReport, Topology
from pipeline.telemetry import MetricsLogger
from pipeline.training.metrics import StepTotals, metrics_dict
from pipeline.workers.drafter_worker import DrafterWorker
from pipeline.workers.prefetcher import PlanSummary, Prefetcher
from pipeline.workers.target_worker import TargetWorker

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    steps: int
    samples: int
    wall_s: float
    losses: list[float] = field(default_factory=list)
    accounts: list[EpochAccount] = field(default_factory=list)
    tau_before: Optional[float] = None
    tau_after: Optional[float] = None
    export_dir: Optional[str] = None
    on_main_thread: bool = True
    checksums_agree: bool = True
    graph_warned: bool = False


def init_ray(job: JobConfig) -> None:
    if ray.is_initialized():
        return
    address = job.cluster.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
        return
    # A private local cluster: logical CPUs enough for every actor even on a 2-core laptop.
    c = job.cluster
    need = (c.targets_per_node + c.drafters_per_node) * c.cpus_per_actor + 1
    ray.init(num_cpus=max(os.cpu_count() or 1, int(need + 0.999)), include_dashboard=False)


@dataclass
class Actors:
    prefetcher: Any
    targets: list[Any]
    drafters: list[Any]
    target_node: list[int]
    drafter_node: list[int]
    groups: list[NodeGroup]


def start_actors(job: JobConfig, r: ResolvedJob, plan: PlanSummary, actors: Actors) -> None:
    """Targets and drafters in their nodes' placement groups, recorded into ``actors``."""
    c, d = job.cluster, job.data
    slot_numel = d.micro_batch_size * d.max_length * r.spec.feature_size
    actors.groups = groups = node_groups(c, r.device)
    targets, drafters = actors.targets, actors.drafters
    target_node, drafter_node = actors.target_node, actors.drafter_node
    world = c.num_drafters
    for n, group in enumerate(groups):
        for i in range(c.targets_per_node):
            rank = len(targets)
            targets.append(start_actor(TargetWorker, group, i, r.device, c.cpus_per_actor,
                                       rank, r.target_path, r.spec.target_layer_ids, r.device,
                                       r.target_dtype, c.num_slots, slot_numel, group.node_id))
            target_node.append(n)
        for i in range(c.drafters_per_node):
            drafters.append(start_actor(
                DrafterWorker, group, c.targets_per_node + i, r.device, c.cpus_per_actor,
                len(drafters), world, r.spec, job.drafter, job.train, r.target_path, r.device,
                r.autocast_dtype, r.target_dtype, slot_numel, plan.num_steps))
            drafter_node.append(n)


def shutdown(actors: Actors) -> None:
    """Close rings (readers first), kill this job's actors, free its placement groups.

    Closing before killing matters on CPU: a killed owner leaves its /dev/shm segment behind.
    """
    from ray.util.placement_group import remove_placement_group

    for group in (actors.drafters, actors.targets):
        try:
            ray.get([h.close.remote() for h in group], timeout=60)
        except Exception as exc:  # a crashed actor must not hide the original error
            log.warning("closing actors failed: %s", exc)
    for handle in [actors.prefetcher, *actors.targets, *actors.drafters]:
        if handle is not None:
            ray.kill(handle)
    for group in actors.groups:
        remove_placement_group(group.pg)


def connect(actors: Actors) -> None:
    """Form the drafters' process group and open every ring in the drafters of its node."""
    master = ray.get(actors.drafters[0].master_address.remote())
    ray.get([d.init_group.remote(master.addr, master.port) for d in actors.drafters])
    handles = ray.get([t.ring_handle.remote() for t in actors.targets])
    ray.get([d.attach.remote([h for h, n in zip(handles, actors.target_node)
                              if n == actors.drafter_node[i]])
             for i, d in enumerate(actors.drafters)])


def step_metrics(report: StepReport, num_targets: int) -> dict[str, float]:
    totals = StepTotals()
    for m in report.micro:
        totals.merge(StepTotals(m.numerator, m.denominator, list(m.correct), list(m.total),
                                len(m.sample_ids), m.tokens))
    wall = max(report.wall_s, 1e-9)
    drafter_busy = defaultdict_sum((m.drafter, m.busy_s) for m in report.micro)
    for res in report.results:
        drafter_busy[res.drafter] = drafter_busy.get(res.drafter, 0.0) + res.busy_s
    out = metrics_dict(totals)
    out.update({
        "train/lr": report.results[0].lr, "train/grad_norm": report.results[0].grad_norm,
        "perf/samples_per_s": totals.samples / wall, "perf/tokens_per_s": totals.tokens / wall,
        "perf/step_time_s": wall, "perf/slot_wait_s": report.slot_wait_s,
        "perf/ready_queue_depth": report.ready_depth,
        "perf/allreduce_s": max(r.reduce_s for r in report.results),
    })
    for t in range(num_targets):
        out[f"perf/target{t}_busy"] = report.produce_busy_s.get(t, 0.0) / wall
    for res in report.results:
        out[f"perf/drafter{res.drafter}_busy"] = drafter_busy.get(res.drafter, 0.0) / wall
        out[f"perf/drafter{res.drafter}_max_mem_gb"] = res.max_memory_bytes / 2**30
    return out


def defaultdict_sum(pairs) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in pairs:
        out[key] = out.get(key, 0.0) + value
    return out


class Driver:
    """Owns one training job from resolved config to exported drafter."""

    def __init__(self, job: JobConfig) -> None:
        self.job = job
        self.r = resolve_job(job)
        self.out_dir = Path(job.train.out_dir)

    def run(self) -> RunSummary:
        job, r = self.job, self.r
        t_start = time.perf_counter()
        init_ray(job)
        check_cluster(job.cluster, r.device)
        actors = Actors(None, [], [], [], [], [])
        try:
            plan = self._start(actors)
            summary = RunSummary(steps=plan.num_steps, samples=plan.num_samples, wall_s=0.0)
            metrics = MetricsLogger(job, self.out_dir)
            try:
                summary.tau_before = self._evaluate(actors, metrics, 0, "before")
                self._train(actors, plan, metrics, summary)
                summary.export_dir = ray.get(actors.drafters[0].export.remote(
                    str(self.out_dir / "export"), job.train.export_dtype))
                summary.tau_after = self._evaluate(actors, metrics, plan.num_steps, "after")
                summary.wall_s = time.perf_counter() - t_start
                metrics.summary({"wall_s": summary.wall_s, "tau_before": summary.tau_before,
                                 "tau_after": summary.tau_after,
                                 "accounts": [a.summary() for a in summary.accounts]})
            finally:
                metrics.close()
        finally:
            shutdown(actors)
        return summary

    def _start(self, actors: Actors) -> PlanSummary:
        """Prefetcher first (its plan sizes the schedulers), then targets and drafters."""
        job, r, c = self.job, self.r, self.job.cluster
        actors.prefetcher = start_actor(
            Prefetcher, None, 0, r.device, c.cpus_per_actor, r.train_path, r.target_path,
            job.data, r.spec.block_size, job.train.epochs, c.num_drafters * job.train.grad_accum,
            job.train.max_steps, r.pad_token_id,
            job.data.max_length if job.drafter.static_shapes else None)
        plan = ray.get(actors.prefetcher.summary.remote())
        log.info("data: %s; %d steps of %d micro-batches", plan.data_summary, plan.num_steps,
                 c.num_drafters * job.train.grad_accum)
        start_actors(job, r, plan, actors)
        connect(actors)
        return plan

    def _train(self, actors: Actors, plan: PlanSummary, metrics: MetricsLogger,
               summary: RunSummary) -> None:
        accounting = SampleAccounting(plan.sample_ids)
        last_step_of_epoch = {}
        total = 0
        for epoch, n in enumerate(plan.steps_per_epoch):
            total += n
            last_step_of_epoch[total - 1] = epoch

        def on_step(report: StepReport) -> None:
            for m in report.micro:
                accounting.add(m.epoch, m.sample_ids)
                summary.on_main_thread &= m.on_main_thread
            summary.on_main_thread &= all(res.on_main_thread for res in report.results)
            skips = max(res.cudagraph_skips for res in report.results)
            if skips and self.job.drafter.compile == "reduce-overhead" and not summary.graph_warned:
                summary.graph_warned = True
                log.warning("drafter.compile=reduce-overhead, but inductor skipped %d CUDA "
                            "graph(s): see TORCH_LOGS=perf_hints for why", skips)
            sums = {round(res.param_checksum, 6) for res in report.results}
            summary.checksums_agree &= len(sums) == 1
            row = step_metrics(report, len(actors.targets))
            row["trainer/step"] = report.step + 1
            summary.losses.append(row["train/loss"])
            metrics.log(row, report.step + 1)
            if (report.step + 1) % self.job.train.log_every == 0:
                log.info("step %d/%d loss %.4f acc %.3f %.1f samples/s", report.step + 1,
                         plan.num_steps, row["train/loss"], row["train/accuracy"],
                         row["perf/samples_per_s"])
            if report.step in last_step_of_epoch:
                epoch = last_step_of_epoch[report.step]
                account = accounting.account(epoch, plan.samples_per_epoch[epoch])
                summary.accounts.append(account)
                log.info("%s", account.summary())

        topo = Topology(actors.prefetcher, actors.targets, actors.drafters, actors.target_node,
                        actors.drafter_node, self.job.cluster.num_slots)
        StepLoop(topo, plan.num_steps, on_step=on_step).run()

    def _evaluate(self, actors: Actors, metrics: MetricsLogger, step: int,
                  label: str) -> Optional[float]:
        if self.job.train.eval_every < 0 or self.job.train.eval_prompts == 0:
            return None
        from transformers import AutoTokenizer

        from pipeline.eval.tau import heldout_prompts

        tokenizer = AutoTokenizer.from_pretrained(self.r.target_path)
        prompts = heldout_prompts(self.r.heldout_path, tokenizer, self.job.train.eval_prompts)
        tau = ray.get(actors.drafters[0].evaluate_tau.remote(
            prompts, self.job.train.eval_max_new_tokens, self.r.eos_token_id))
        metrics.log({"eval/tau": tau, "trainer/step": step}, step)
        log.info("tau %s training: %.3f on %d held-out prompts", label, tau, len(prompts))
        return tau
