"""The driver: resolves the job, starts the actors, runs the step loop, checkpoints, exports."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

from ray.exceptions import RayError

from pipeline import checkpoint as ckpt
from pipeline.runtime import startup_gc, stop_signals
from pipeline.checkpoint import CheckpointSaves
from pipeline.job.resume_contract import KEY as CONTRACT_KEY
from pipeline.job.resume_contract import Contract, check_resume
from pipeline.checkpoint.cursor import Cursor
from pipeline.checkpoint.point import ResumePoint
from pipeline.job.config import JobConfig
from pipeline.runtime.diskfull import secondary
from pipeline.driver.accounting import SampleAccounting
from pipeline.driver.actors import ActorGroup
from pipeline.driver.drafter_group import OWNER_LANE
from pipeline.driver.eval_tally import EvalTally
from pipeline.driver.evaluator import TauEvaluator
from pipeline.driver.finished import nothing_left
from pipeline.driver.launcher import check_cluster, live_nodes
from pipeline.driver.layout import with_live_layout
from pipeline.driver.memory import check_target_memory
from pipeline.driver.observers import step_observers
from pipeline.driver.placement import check_placement
from pipeline.driver.progress import Progress
from pipeline.driver.recovery import NonFiniteError, Recovery, lost_actor
from pipeline.driver.runlock import RunLock
from pipeline.driver.scheduler import AfterStepCall, StepLoop
from pipeline.driver.summary import RunSummary
from pipeline.driver.telemetry import MetricsLogger
from pipeline.driver.trace import TraceRecorder
from pipeline.job.job_data import load_job_data
from pipeline.checks.preflight import PreflightError
from pipeline.job.resolve import resolve_job
from pipeline.runtime.wandb_env import check_wandb
from pipeline.workers.eval_worker import EvalResult, EvalWorker
from pipeline.workers.prefetcher import PlanSummary

log = logging.getLogger(__name__)


class Driver:
    """Owns one training job from resolved config to exported drafter."""

    def __init__(self, job: JobConfig) -> None:
        self.job = job
        check_wandb(job.logger)
        self.r = resolve_job(job)  # early, paths checked; run() re-decides the device
        self.out_dir = Path(job.train.out_dir)
        # What the checkpoints of this job mean only under; a resume is checked against it.
        self.contract = Contract.of(job, self.r)
        self.resume_from = ckpt.resolve_resume(job.train.checkpoint.resume, self.out_dir)
        self.resume: Optional[ResumePoint] = None
        if self.resume_from is not None:
            check_resume(ckpt.read_state(self.resume_from), self.contract, self.resume_from,
                         job.train.checkpoint.allow_data_change)
            self.resume = ckpt.read_point(self.resume_from)
        self.saves = CheckpointSaves(self.out_dir, job.train.checkpoint.keep_last,
                                     self._state_extra, last=self.resume_from)
        # A finished run's rerun ends before the data is read or Ray starts.
        self.finished = nothing_left(job.train.plan, self.resume, self.resume_from) \
            if self.resume is not None else None
        # Read, checked and encoded before Ray: a bad line stops the job here as one line, and
        # the prefetcher gets this encoded set instead of reading the file again.
        self.data = None if self.finished else \
            load_job_data(job, self.r, heldout=job.train.eval.off is None)
        self.actors: Optional[ActorGroup] = None  # while running
        # Called with the steps done after each step (monitoring; fault-injection tests), after
        # the step's other observers (pipeline/driver/observers.py).
        self.step_listeners: list[Callable[[int], None]] = []
        self._loop: Optional[StepLoop] = None
        self.evaluator: Optional[TauEvaluator] = None
        self.eval_worker: type = EvalWorker  # the evaluator actor's class (fault injection)

    def run(self) -> RunSummary:
        # One job per out_dir, held before anything is written there or Ray starts.
        with RunLock(self.out_dir):
            return self._run_locked()

    def _run_locked(self) -> RunSummary:
        c = self.job.cluster
        t_start = time.perf_counter()
        idle = self._nothing_to_do()
        if idle is not None:
            return idle
        # Every actor of every node, the tau evaluator and the prefetcher: cpus_per_actor each.
        actors = c.num_targets * self.job.target.stages + c.num_drafters + 2
        try:
            return self._run_on_ray(actors * c.cpus_per_actor, t_start)
        except KeyboardInterrupt:
            # Ctrl-C or SIGTERM. The actors are closed (a drafter finishes the write in flight
            # first) and Ray is down: nothing of this job writes any more, and a save it had
            # not yet published is dropped (the lock is still held, so none is another job's).
            ckpt.discard_unfinished(self.out_dir)
            raise

    def _run_on_ray(self, cpus: float, t_start: float) -> RunSummary:
        # Ray's core worker takes SIGTERM over at ray.init: stop_signals gives it back.
        with stop_signals.ray_session(self.job.cluster.address, cpus):
            self._check_cluster()
            ckpt.clean_stale(self.out_dir)
            with contextlib.ExitStack() as stack:
                # The evaluator is launched first and built while the training actors start,
                # and closed first too: it maps drafter rank 0's weights ring, and on CPU its
                # unmapping talks to the ring owner's torch_shm_manager, which dies with the
                # drafter. Closed after the drafters, it aborted ("Broken pipe"; Ray's
                # worker-died notice in 1 of 3 demo runs, 2026-12-05).
                evaluator = stack.enter_context(
                    TauEvaluator(self.job, self.r, self._prompts, self.eval_worker))
                actors = stack.enter_context(ActorGroup(self.job, self.r, self.data.train,
                                                        self.resume, self.resume_from))
                stack.push(evaluator)  # its exit before the actors'; the later one is a no-op
                evaluator.wait_ready()
                self.actors = actors
                self.evaluator = evaluator
                self._load_checkpoint(actors, self.resume_from, self.resume)
                return self._run(actors, t_start)

    def _check_cluster(self) -> None:
        """The layout, the placement and the target's memory against the live cluster, before
        any actor starts: what can never work there is refused in one line."""
        try:
            # cluster.layout=auto: the split per node from the rates, checked as a manual one.
            self.job = with_live_layout(self.job)
            c, stages = self.job.cluster, self.job.target.stages
            device = check_cluster(c, self.job.train.eval, stages)
            if device != self.r.device:  # the cluster's nodes decide, not this host's
                self.r = resolve_job(self.job, device=device)
            nodes = live_nodes()
            check_placement(c, self.job.train.eval, device, nodes, stages)
            check_target_memory(self.job, self.r, device, nodes)
        except ValueError as e:
            raise PreflightError(str(e)) from None

    def _nothing_to_do(self) -> Optional[RunSummary]:
        """A resume whose checkpoint already holds what the job asks for trains nothing."""
        if self.finished is None:
            return None
        point = self.resume
        evals = EvalTally(off=self.job.train.eval.off)
        return self._idle(RunSummary(point.step, point.step, 0, evals=evals), self.finished)

    def _idle(self, summary: RunSummary, why: str) -> RunSummary:
        log.warning("nothing to train: %s", why)
        summary.nothing_to_train = why
        return summary

    def _load_checkpoint(self, actors: ActorGroup, path: Optional[Path],
                         point: Optional[ResumePoint]) -> None:
        if path is None:
            return
        step = actors.load_checkpoint(str(path))
        assert point is not None and step == point.step, \
            f"checkpoint step mismatch: {step} != {point}"
        parts = actors.drafter_group.load_seconds()
        log.info("resumed from %s at step %d (drafter rank 0: %s)", path, step,
                 ", ".join(f"{k} {v:.1f}s" for k, v in parts.items()))

    def _run(self, actors: ActorGroup, t_start: float) -> RunSummary:
        job, plan = self.job, actors.plan
        summary = RunSummary(plan.first_step, self._stop_step(plan), plan.num_samples,
                             evals=EvalTally(off=job.train.eval.off))
        if summary.steps <= 0:
            # (a data file without a usable sample was refused before Ray started)
            return self._idle(summary, f"the plan has no steps left after step "
                                       f"{plan.first_step}")
        metrics = MetricsLogger(job, self.out_dir, resumed=self.resume is not None)
        startup_gc.started()  # a command line's driver: its imports are done
        try:
            # tau before training runs beside the first steps, not ahead of them.
            start_calls = [self._tau_before(actors, metrics, summary)] \
                if self.resume is None and self.evaluator.enabled else []
            self._train_recovering(actors, metrics, summary, start_calls)
            summary.export_dir = actors.drafter_group.export(
                str(self.out_dir / "export"), job.train.export_dtype)
            summary.tau_after = self._evaluate(actors, metrics, summary)
            summary.wall_s = time.perf_counter() - t_start
            metrics.summary({"wall_s": summary.wall_s, "tau_before": summary.tau_before,
                             "tau_after": summary.tau_after, **summary.evals.metrics(),
                             "eval/first_error": summary.evals.first_error,
                             "skipped_steps": sorted(summary.skipped_steps),
                             "restarts": [r.line() for r in summary.restarts],
                             "accounts": [a.summary() for a in summary.accounts]})
        finally:
            with secondary("closing metrics.jsonl"):
                metrics.close()
        return summary

    def _train_recovering(self, actors: ActorGroup, metrics: MetricsLogger,
                          summary: RunSummary, start_calls: list[AfterStepCall]) -> None:
        """Train; after a lost actor, restart the set from the last checkpoint and go on."""
        plan = actors.plan  # this job's plan: the accounting counts its samples per epoch
        accounting = SampleAccounting(plan.sample_ids)
        while True:
            try:
                return self._train(actors, plan, accounting, metrics, summary, start_calls)
            except RayError as exc:
                seen = time.time()
                pending = self._loop.pending if self._loop is not None else {}
                name = lost_actor(exc, pending, actors.names(), actors.handles())
                limit = self.job.train.recovery.max_restarts
                if name is None:
                    raise
                if len(summary.restarts) >= limit:
                    log.error("lost %s with no restart left (train.recovery.max_restarts=%d)",
                              name, limit)
                    raise
                self._restart(actors, Recovery(name, seen, 0, None), accounting, metrics,
                              summary)
                start_calls = []  # a call in flight on the lost set is not collected again

    def _restart(self, actors: ActorGroup, recovery: Recovery, accounting: SampleAccounting,
                 metrics: MetricsLogger, summary: RunSummary) -> None:
        path = self.saves.last
        point = ckpt.read_point(path) if path is not None else None
        step = point.step if point is not None else 0
        recovery.resumed_step, recovery.checkpoint = step, str(path) if path else None
        summary.restarts.append(recovery)
        log.error("%s (restart %d of %d)", recovery.line(), len(summary.restarts),
                  self.job.train.recovery.max_restarts)
        actors.restart_after_loss(recovery.actor, point, path)  # fills actors.phases
        t0 = time.time()
        self._load_checkpoint(actors, path, point)
        recovery.restarted_at = time.time()
        recovery.phases = {**actors.phases, "checkpoint loaded": recovery.restarted_at - t0}
        log.info("actor set restarted %.1fs after the loss (%s)",
                 recovery.restarted_at - recovery.detected_at,
                 ", ".join(f"{k} {v:.1f}s" for k, v in recovery.phases.items()))
        # What ran after the checkpoint is lost with the actors: forget it, train it again.
        if self.evaluator is not None:
            self.evaluator.forget_in_flight()  # their results are never collected
        accounting.rollback(step)
        del summary.losses[max(0, step - summary.first_step):]
        epoch = point.epoch if point is not None else 0
        summary.accounts = [a for a in summary.accounts if a.epoch < epoch]
        summary.skipped_steps = {s for s in summary.skipped_steps if s <= step}
        metrics.log({"recovery/restarts": len(summary.restarts), "trainer/step": step}, step)

    def _train(self, actors: ActorGroup, job_plan: PlanSummary, accounting: SampleAccounting,
               metrics: MetricsLogger, summary: RunSummary,
               start_calls: list[AfterStepCall]) -> None:
        plan = actors.plan
        cursor = Cursor(plan, actors.resume)
        stop = summary.end_step
        progress = Progress(plan.first_step, stop, self.job.train.log_every)
        trace = TraceRecorder(self.job.logger.trace_start, self.job.logger.trace_steps)
        self.saves.start(plan.first_step, summary.checkpoints)

        observers = step_observers(
            summary=summary, recovery=summary.restarts[-1] if summary.restarts else None,
            accounting=accounting, saves=self.saves, compile_mode=self.job.drafter.compile,
            metrics=metrics, num_targets=len(actors.targets), progress=progress, trace=trace,
            cursor=cursor, job_plan=job_plan, listeners=self.step_listeners,
            max_nonfinite_in_row=self.job.train.recovery.max_nonfinite_in_row)

        def after_step(step: int) -> list[AfterStepCall]:
            calls = []
            if self.job.train.eval.due_between(step + 1, stop):
                calls.append(self._evaluate_async(actors, metrics, summary, step + 1))
            if self._checkpoint_due(step + 1, stop):
                ref = self.saves.save_async(actors.drafter_group, cursor, step)
                # The seconds it held training come back again with the save's record (logged
                # when it counts); here only its completion matters.
                calls.append(AfterStepCall(ref, lambda held_s: None, lane=OWNER_LANE))
            return calls

        self._loop = StepLoop(actors.topology(), stop, plan.first_step, observers, after_step,
                              start_calls=start_calls)
        try:
            self._loop.run()
            # The last checkpoint counts once its background write is verified.
            for done in actors.drafter_group.wait_saves():
                self.saves.on_saved(done)
        except NonFiniteError as exc:
            saved = self.saves.save_now(actors.drafter_group, cursor)
            raise NonFiniteError(f"{exc}. The last good state is saved in {saved}: its "
                                 "weights are those of the last finite update") from None
        finally:
            progress.close()
            with secondary("writing trace.json"):
                trace.write(self.out_dir / "trace.json")  # logs the steps it holds

    def _state_extra(self) -> dict:
        """What state.json holds beside the resume point."""
        return {"drafter_config": self.r.spec.hf_config, "job": asdict(self.job),
                CONTRACT_KEY: self.contract.record()}

    def _evaluate_async(self, actors: ActorGroup, metrics: MetricsLogger, summary: RunSummary,
                        step: int) -> AfterStepCall:
        """Evaluate the weights after ``step`` on the evaluator while training goes on; the
        result is logged at ``step`` whenever it lands."""
        when = "before training" if step == 0 else f"at step {step}"

        def done(result: EvalResult) -> None:
            if self._record_eval(result, metrics, summary, step, when) is not None:
                log.info("tau at step %d: %.3f (evaluated in %.1fs beside training; weights "
                         "through the %s)", step, result.tau, result.seconds, result.weights_by)
        assert self.evaluator is not None
        return self.evaluator.behind_step(actors.drafter_group, step, done)

    def _tau_before(self, actors: ActorGroup, metrics: MetricsLogger,
                    summary: RunSummary) -> AfterStepCall:
        """tau of the untrained drafter: its weights are copied ahead of step 1 and evaluated
        while training runs."""
        call = self._evaluate_async(actors, metrics, summary, 0)

        def done(result: EvalResult) -> None:
            call.on_done(result)
            summary.tau_before = None if result.error else result.tau
        return dataclasses.replace(call, on_done=done)

    def _stop_step(self, plan: PlanSummary) -> int:
        stop = self.job.train.plan.stop_at_step
        return plan.end_step if stop is None else max(plan.first_step, min(stop, plan.end_step))

    def _checkpoint_due(self, steps_done: int, end_step: int) -> bool:
        cfg = self.job.train.checkpoint
        if steps_done == end_step:
            return cfg.final
        return cfg.every > 0 and steps_done % cfg.every == 0

    def _evaluate(self, actors: ActorGroup, metrics: MetricsLogger,
                  summary: RunSummary) -> Optional[float]:
        """tau after training (waited for); None when eval is off or it failed."""
        assert self.evaluator is not None
        step = summary.end_step
        result = self.evaluator.evaluate(actors.drafter_group, step)
        if result is None:
            return None
        tau = self._record_eval(result, metrics, summary, step, "after training")
        if tau is not None:
            log.info("tau after training: %.3f on %d held-out prompts", tau, result.num_prompts)
        return tau

    def _record_eval(self, result: EvalResult, metrics: MetricsLogger, summary: RunSummary,
                     step: int, when: str) -> Optional[float]:
        """Count an evaluation's outcome and log its row at ``step``: its tau, or None."""
        ok = summary.evals.record(result, when)
        row = {**summary.evals.metrics(), "trainer/step": step}
        if ok:
            row["eval/tau"] = result.tau
        metrics.log(row, step)
        return result.tau if ok else None

    def _prompts(self) -> list[list[int]]:
        assert self.data.heldout is not None, "held-out prompts asked for with eval off"
        return self.data.heldout
