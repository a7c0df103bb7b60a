"""The single-process reference trainer: one process, one device, no Ray.

It runs the target and the drafter in turn on each micro-batch of the same step plan that the
Ray pipeline follows, so it is the reference the pipeline must match.
"""

from __future__ import annotations

import dataclasses

import json
import logging
import time
from pathlib import Path

import torch

from pipeline.job.assembly import batch_shapes, packing_of, plan_for
from pipeline.job.config import JobConfig
from pipeline.data import Batch
from pipeline.job.job_data import load_job_data
from pipeline.model.serving_format import save_drafter
from pipeline.model.stages import load_staged_target
from pipeline.model.target import load_target, load_target_head
from pipeline.model.target_init import target_init_of
from pipeline.job.resolve import ResolvedJob, resolve_job
from pipeline.training.drafter_trainer import DrafterTrainer
from pipeline.training.metrics import StepTotals, metrics_dict
from pipeline.training.plan import StepPlan

log = logging.getLogger(__name__)


class SingleProcessTrainer:
    def __init__(self, job: JobConfig, resolved: ResolvedJob | None = None) -> None:
        self.job = job
        self.r = r = resolved or resolve_job(job)
        # Read, checked and encoded before any model loads. tau runs as the pipeline's does:
        # before and after training, every train.eval.every steps between, never when off.
        self.tau_off = job.train.eval.off
        data = load_job_data(job, r, heldout=self.tau_off is None)
        self.dataset, self.prompts = data.train, data.heldout
        self.plans = plan_for(job, self.dataset)
        k = job.target.stages
        self.target = load_target(r.target_path, r.spec.target_layer_ids, r.device,
                                  r.target_dtype, compile=job.target.compile,
                                  final_hidden=job.drafter.distills) if k == 1 else \
            load_staged_target(r.target_path, r.spec.target_layer_ids, k, r.device,
                               r.target_dtype, compile=job.target.compile)
        self.drafter = DrafterTrainer(r.spec, job.drafter, job.train.optim, job.train.seed,
                                      load_target_head(r.target_path), r.device,
                                      r.autocast_dtype, total_steps=len(self.plans),
                                      packing=packing_of(job),
                                      init=target_init_of(job.drafter, r.spec, r.target_path))
        self.shapes = batch_shapes(job)
        self._full_target = None  # loaded on the first tau evaluation

    def evaluate_tau(self) -> float:
        from pipeline.eval.tau import evaluate_tau, load_full_target

        cfg = self.job.train.eval
        if self._full_target is None:
            self._full_target = load_full_target(self.r.target_path, self.r.device,
                                                 self.r.target_dtype)
        # Nothing trains beside this evaluation (it runs between steps): the GPU is its own.
        decode = dataclasses.replace(cfg.decode_options(), gpu_duty=1.0)
        tau = evaluate_tau(self._full_target, self.drafter.model, self.drafter.head, self.prompts,
                           cfg.max_new_tokens, self.r.eos_token_id, decode)
        log.info("tau %.3f on %d held-out prompts", tau, len(self.prompts))
        return tau

    def tau_due(self, steps_done: int) -> bool:
        """tau between steps: every train.eval.every steps, the last step left to the caller."""
        return self.tau_off is None and self.job.train.eval.due_between(steps_done,
                                                                         len(self.plans))

    def features(self, batch: Batch) -> torch.Tensor:
        dev = self.r.device
        return self.target(batch.input_ids.to(dev))

    def run_step(self, plan: StepPlan) -> tuple[StepTotals, float]:
        for mb in plan.micro_batches:
            batch = self.shapes.collate([self.dataset[i] for i in mb], self.r.pad_token_id)
            feats = self.features(batch)
            self.drafter.forward_backward(feats, batch.input_ids, batch.loss_mask,
                                          list(batch.sample_ids), plan.epoch)
        totals = self.drafter.take_totals()
        return totals, self.drafter.step().grad_norm

    def train(self) -> list[dict]:
        out = Path(self.job.train.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        history = []
        with open(out / "metrics.jsonl", "w") as sink:
            for step, plan in enumerate(self.plans):
                t0 = time.perf_counter()
                lr = self.drafter.lr
                totals, norm = self.run_step(plan)
                row = {"step": step + 1, "epoch": plan.epoch, "lr": lr, "grad_norm": norm,
                       "samples": totals.samples, "step_time_s": time.perf_counter() - t0,
                       **metrics_dict(totals)}
                history.append(row)
                sink.write(json.dumps(row) + "\n")
                if self.tau_due(step + 1):  # a row of its own, as the pipeline writes it
                    sink.write(json.dumps({"step": step + 1,
                                           "eval/tau": self.evaluate_tau()}) + "\n")
                    sink.flush()
                if (step + 1) % self.job.train.log_every == 0 or step + 1 == len(self.plans):
                    log.info("step %d/%d loss %.4f acc %.3f lr %.2e", step + 1,
                             len(self.plans), row["train/loss"], row["train/accuracy"], lr)
        save_drafter(self.drafter.model, out / "export", self.job.train.export_dtype)
        return history
