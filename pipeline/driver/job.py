"""The driver: resolves the job, starts the actors, runs the step loop, checkpoints, exports."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import ray

from pipeline.config import JobConfig
from pipeline.driver import checkpoint as ckpt
from pipeline.driver.accounting import EpochAccount, SampleAccounting
from pipeline.driver.actors import ActorGroup
from pipeline.driver.cursor import Cursor
from pipeline.driver.evaluator import TauEvaluator
from pipeline.driver.launcher import check_cluster
from pipeline.driver.progress import Progress
from pipeline.driver.report import step_metrics
from pipeline.driver.scheduler import AfterStepCall, StepLoop, StepReport
from pipeline.driver.telemetry import MetricsLogger
from pipeline.driver.trace import TraceRecorder
from pipeline.ray_start import ray_session
from pipeline.resolve import resolve_job
from pipeline.workers.prefetcher import PlanSummary
from pipeline.wandb_env import check_wandb
from pipeline.workers.eval_worker import EvalResult

log = logging.getLogger(__name__)


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

    @property
    def steps(self) -> int:
        return self.end_step - self.first_step


class Driver:
    """Owns one training job from resolved config to exported drafter."""

    def __init__(self, job: JobConfig) -> None:
        self.job = job
        check_wandb(job.logger)
        self.r = resolve_job(job)
        self.out_dir = Path(job.train.out_dir)
        self.resume_from = ckpt.resolve_resume(job.train.checkpoint.resume, self.out_dir)
        self.resume = ckpt.read_point(self.resume_from) if self.resume_from else None
        self._heldout: Optional[list[list[int]]] = None
        self.evaluator: Optional[TauEvaluator] = None

    def run(self) -> RunSummary:
        c = self.job.cluster
        t_start = time.perf_counter()
        # The +1 actor: the tau evaluator (the prefetcher rides in the final +1 CPU).
        with ray_session(c.address, (c.targets_per_node + c.drafters_per_node + 1)
                         * c.cpus_per_actor + 1):
            check_cluster(c, self.r.device)
            with ActorGroup(self.job, self.r, self.resume) as actors, \
                    TauEvaluator(self.job, self.r, self._prompts) as evaluator:
                self.evaluator = evaluator
                self._load_checkpoint(actors)
                return self._run(actors, t_start)

    def _load_checkpoint(self, actors: ActorGroup) -> None:
        if self.resume_from is None:
            return
        step = actors.load_checkpoint(str(self.resume_from))
        assert step == self.resume.step, f"checkpoint step mismatch: {step} != {self.resume}"
        log.info("resumed from %s at step %d", self.resume_from, step)

    def _run(self, actors: ActorGroup, t_start: float) -> RunSummary:
        job, plan = self.job, actors.plan
        summary = RunSummary(plan.first_step, self._stop_step(plan), plan.num_samples)
        metrics = MetricsLogger(job, self.out_dir, resumed=self.resume is not None)
        try:
            if self.resume is None:
                summary.tau_before = self._evaluate(actors, metrics, 0, "before")
            self._train(actors, plan, metrics, summary)
            summary.export_dir = ray.get(actors.drafters[0].export.remote(
                str(self.out_dir / "export"), job.train.export_dtype))
            summary.tau_after = self._evaluate(actors, metrics, summary.end_step, "after")
            summary.wall_s = time.perf_counter() - t_start
            metrics.summary({"wall_s": summary.wall_s, "tau_before": summary.tau_before,
                             "tau_after": summary.tau_after,
                             "accounts": [a.summary() for a in summary.accounts]})
        finally:
            metrics.close()
        return summary

    def _train(self, actors: ActorGroup, plan: PlanSummary, metrics: MetricsLogger,
               summary: RunSummary) -> None:
        accounting = SampleAccounting(plan.sample_ids)
        cursor = Cursor(plan, self.resume)
        stop = summary.end_step
        progress = Progress(plan.first_step, stop, self.job.train.log_every)
        trace = TraceRecorder(self.job.logger.trace_start, self.job.logger.trace_steps)

        def on_step(report: StepReport) -> None:
            for m in report.micro:
                accounting.add(m.epoch, m.sample_ids)
            self._check_replicas(report, summary)
            row = step_metrics(report, len(actors.targets))
            row["trainer/step"] = report.step + 1
            summary.losses.append(row["train/loss"])
            metrics.log(row, report.step + 1)
            progress.update(report.step + 1, row)
            trace.add(report)
            if cursor.epoch_ends_at(report.step) or report.step + 1 == stop:
                account = accounting.account(report.epoch,
                                             plan.samples_planned(report.epoch))
                summary.accounts.append(account)
                log.info("%s", account.summary())

        def after_step(step: int) -> list[AfterStepCall]:
            calls = []
            every = self.job.train.eval.every
            if every > 0 and (step + 1) % every == 0 and step + 1 < stop:
                calls.append(self._evaluate_async(actors, metrics, step + 1))
            if self._checkpoint_due(step + 1, stop):
                calls.append(self._save_async(actors, cursor, summary, step))
            return calls

        try:
            StepLoop(actors.topology(), stop, plan.first_step, on_step, after_step).run()
        finally:
            progress.close()
            written = trace.write(self.out_dir / "trace.json")
            if written:
                log.info("trace of steps %d..%d: %s", self.job.logger.trace_start + 1,
                         self.job.logger.trace_start + self.job.logger.trace_steps, written)

    def _save_async(self, actors: ActorGroup, cursor: Cursor, summary: RunSummary,
                    step: int) -> AfterStepCall:
        """Queue a checkpoint on drafter rank 0 right behind step ``step``."""
        staging = ckpt.staging_dir(self.out_dir, step + 1)
        ref = actors.drafters[0].save_checkpoint.remote(str(staging))
        point = cursor.after(step)

        def done(_path: str) -> None:
            final = ckpt.finalize(staging, point, {"drafter_config": self.r.spec.hf_config,
                                                   "job": asdict(self.job)})
            summary.checkpoints.append(str(final))
            log.info("checkpoint %s", final)
        return AfterStepCall(ref, done)

    def _evaluate_async(self, actors: ActorGroup, metrics: MetricsLogger,
                        step: int) -> AfterStepCall:
        """Evaluate the weights after ``step`` on the evaluator while training goes on; the
        result is logged at ``step`` whenever it lands."""
        def done(result: EvalResult) -> None:
            if result.error:
                log.warning("tau at step %d failed, training goes on: %s", step, result.error)
                return
            metrics.log({"eval/tau": result.tau, "trainer/step": step}, step)
            log.info("tau at step %d: %.3f (evaluated in %.1fs beside training)", step,
                     result.tau, result.seconds)
        assert self.evaluator is not None
        return self.evaluator.behind_step(actors.drafters[0], step, done)

    def _stop_step(self, plan: PlanSummary) -> int:
        stop = self.job.train.plan.stop_at_step
        return plan.end_step if stop is None else max(plan.first_step, min(stop, plan.end_step))

    def _checkpoint_due(self, steps_done: int, end_step: int) -> bool:
        every = self.job.train.checkpoint.every
        return steps_done == end_step or (every > 0 and steps_done % every == 0)

    def _check_replicas(self, report: StepReport, summary: RunSummary) -> None:
        summary.on_main_thread &= all(m.on_main_thread for m in report.micro)
        summary.on_main_thread &= all(res.on_main_thread for res in report.results)
        summary.checksums_agree &= len({round(r.param_checksum, 6) for r in report.results}) == 1
        skips = max(res.cudagraph_skips for res in report.results)
        if skips and self.job.drafter.compile == "reduce-overhead" and not summary.graph_warned:
            summary.graph_warned = True
            log.warning("drafter.compile=reduce-overhead, but inductor skipped %d CUDA "
                        "graph(s): see TORCH_LOGS=perf_hints for why", skips)

    def _evaluate(self, actors: ActorGroup, metrics: MetricsLogger, step: int,
                  label: str) -> Optional[float]:
        assert self.evaluator is not None
        result = self.evaluator.evaluate(actors.drafters[0], step)
        if result is None:
            return None
        if result.error:
            log.warning("tau %s training failed: %s", label, result.error)
            return None
        metrics.log({"eval/tau": result.tau, "trainer/step": step}, step)
        log.info("tau %s training: %.3f on %d held-out prompts", label, result.tau,
                 result.num_prompts)
        return result.tau

    def _prompts(self) -> list[list[int]]:
        if self._heldout is None:
            from transformers import AutoTokenizer

            from pipeline.eval.tau import heldout_prompts

            tokenizer = AutoTokenizer.from_pretrained(self.r.target_path)
            self._heldout = heldout_prompts(self.r.heldout_path, tokenizer,
                                            self.job.train.eval.prompts, self.job.data.format,
                                            self.job.data.enable_thinking)
        return self._heldout
