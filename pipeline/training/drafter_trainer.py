"""The drafter's side of training: forward/backward of micro-batches and the optimizer step.

One class serves the single-process reference trainer and the Ray drafter workers (which add
only the transport and the gradient all-reduce), so both compute the same thing.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from pipeline.data.config import MAX_BUCKETS
from pipeline.dist import fsdp
from pipeline.model.config import DrafterConfig, DrafterSpec
from pipeline.model.drafter import DFlashDrafter
from pipeline.model.target import TargetHead
from pipeline.model.target_init import TargetInit, apply_target_init
from pipeline.objective.anchors import Anchors
from pipeline.objective.loss import LossParts
from pipeline.objective.packing import Packing, pack_anchors, pack_rows
from pipeline.objective.step import Objective, drafter_loss
from pipeline.training.config import OptimConfig
from pipeline.training.metrics import StepTotals
from pipeline.training.optim import (apply_update, build_optimizer, build_scheduler,
                                     reapply_config)


# (gradients, local denominator) -> global denominator; sums the gradients in place.
GradReducer = Callable[[list[torch.Tensor], float], float]


@dataclass(frozen=True)
class StepOutcome:
    denominator: float  # the step's global denominator (NaN if any replica's loss was not finite)
    grad_norm: float    # before clipping
    skipped: bool       # non-finite loss or gradient: no update, on every replica alike


def build_drafter(spec: DrafterSpec, seed: int, device: str,
                  init: Optional[TargetInit] = None) -> DFlashDrafter:
    """Random init from ``seed``, then ``init``'s target layers copied over it (if any):
    every replica and the reference on the same kind of device start identical. On CUDA the
    init runs on the GPU: on the CPU, in an actor's one thread, drawing the 8B recipe's 1.05B
    random weights took 15-20 s, which every drafter start and restart waited for."""
    torch.manual_seed(seed)  # every device's generator
    on_gpu = torch.device(device).type == "cuda"
    with torch.device(device) if on_gpu else contextlib.nullcontext():
        model = DFlashDrafter(spec)
    if init is not None:
        apply_target_init(model, init)
    return model.to(device)


def _with_empty_rows(anchors: Anchors, rows: int) -> Anchors:
    """``anchors`` with rows added up to ``rows``, every block of them padding (keep=False at
    position 0: its queries see only their own block, and it weighs nothing)."""
    n, width = anchors.positions.shape
    extra = (rows - n, width)
    positions = torch.cat([anchors.positions, anchors.positions.new_zeros(extra)])
    keep = torch.cat([anchors.keep, anchors.keep.new_zeros(extra)])
    return Anchors(positions, keep)


class DrafterTrainer:
    def __init__(self, spec: DrafterSpec, options: DrafterConfig, optim: OptimConfig,
                 seed: int, head: TargetHead | Callable[[], TargetHead], device: str,
                 autocast_dtype: Optional[torch.dtype], total_steps: int,
                 packing: Optional[Packing] = None, init: Optional[TargetInit] = None) -> None:
        """``init``: drafter.init=target_layers resolved (model/target_init.py); None: random.
        ``head``: the target's head, or a call that gives it, made once the drafter is built:
        the drafter worker reads the head from disk beside the build (:attr:`head_wait_s`
        says how long the build then still waited for it; :attr:`setup_s`, how long the rest
        took once the drafter and its head were in place: gradients, optimizer, compile)."""
        self.spec = spec
        self.packing = packing  # data.batching=pack: rows run as one sequence (packing.py)
        self.options = options
        self.optim = optim
        self.seed = seed
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.model = build_drafter(spec, seed, device, init)
        waited = time.perf_counter()
        head = head() if callable(head) else head
        self.head_wait_s = time.perf_counter() - waited
        self.head = head.to(device, autocast_dtype or torch.float32)
        set_up = time.perf_counter()
        # Gradients get buffers of their own for the whole run. Under CUDA graphs
        # (compile=reduce-overhead) a first backward would otherwise adopt the graph's output
        # memory as .grad, and the next micro-batch's replay would overwrite it before the
        # step: gradient accumulation would read freed graph memory.
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)
        self.objective = Objective.from_config(spec, options)
        self.total_steps = total_steps
        self.optimizer = build_optimizer(self.model, optim)
        self.scheduler = build_scheduler(self.optimizer, total_steps, optim)
        self.sharded: Optional[fsdp.ShardedReducer] = None  # drafter.parallel=fsdp
        self.forward = self._compiled(options.compile)
        self.totals = StepTotals()
        self.local_denominator = 0.0  # this replica's share of the current step
        self.local_nonfinite = False  # a micro-batch of this step had a NaN/inf loss
        self.skipped_steps = 0
        self.steps_done = 0
        self.setup_s = time.perf_counter() - set_up

    def shard(self, device: torch.device) -> None:
        """drafter.parallel=fsdp, once the process group is up and before any step: shard
        the weights (pipeline/dist/fsdp.py); AdamW and its schedule are built again on the
        shards. A collective: every rank."""
        assert self.steps_done == 0 and self.sharded is None, "shard before the first step"
        for p in self.model.parameters():
            p.grad = None  # FSDP's gathered parameters get theirs from the first backward
        fsdp.shard(self.model, device)
        self.sharded = fsdp.ShardedReducer(self.model, device)
        self.optimizer = build_optimizer(self.model, self.optim)
        self.scheduler = build_scheduler(self.optimizer, self.total_steps, self.optim)
        fsdp.gather(self.model)  # the micro-batches run on the gathered weights

    def _compiled(self, mode: str) -> Callable[..., torch.Tensor]:
        if mode == "off":
            return self.model
        # Each micro-batch shape is one compiled graph: with data.batching=bucket up to two per
        # bucket (its full and its epoch-tail micro-batch), for at most MAX_BUCKETS buckets.
        # Past the limit dynamo would fall back to eager for every new shape.
        config = torch._dynamo.config
        key = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        setattr(config, key, max(getattr(config, key), 2 * MAX_BUCKETS + 2))
        return torch.compile(self.model, mode=None if mode == "default" else mode,
                             dynamic=False if self.options.static_shapes else None)

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device, dtype=self.autocast_dtype)

    def forward_backward(self, features: torch.Tensor, input_ids: torch.Tensor,
                         loss_mask: torch.Tensor, sample_ids: list[int], epoch: int) -> LossParts:
        """Backpropagate one micro-batch's loss numerator; gradients accumulate in .grad."""
        # Rows past the samples are empty padding rows (a packed bucket's, or a static
        # micro-batch's at an epoch's end): no anchors.
        anchors = self.objective.anchors(loss_mask[:len(sample_ids)].cpu(), sample_ids,
                                         self.seed, epoch)
        if self.options.compile == "reduce-overhead":
            # CUDA graphs reuse output buffers across replays: mark the new iteration.
            torch.compiler.cudagraph_mark_step_begin()
        dev = self.device
        tokens = int(loss_mask.sum())
        features, input_ids, loss_mask = features.to(dev), input_ids.to(dev), loss_mask.to(dev)
        positions = None
        if self.packing is not None:
            anchors = pack_anchors(anchors, input_ids.shape[1], self.packing.anchors)
            features, input_ids, loss_mask, positions = pack_rows(
                features, input_ids, loss_mask, self.packing.tokens)
        elif anchors.positions.shape[0] < input_ids.shape[0]:
            anchors = _with_empty_rows(anchors, input_ids.shape[0])
        with self._autocast():
            parts = drafter_loss(self.forward, self.head, self.objective, features, input_ids,
                                 loss_mask, anchors.to(dev), self.autocast_dtype, positions)
        parts.numerator.backward()
        self.local_nonfinite |= not math.isfinite(float(parts.numerator.detach()))
        self.local_denominator += float(parts.denominator)
        self.totals.add_parts(parts, samples=len(sample_ids), tokens=tokens)
        return parts

    def step(self, reduce: Optional[GradReducer] = None) -> StepOutcome:
        """Apply sum(grads) / sum(denominators) over the step, or skip it when not finite.

        ``reduce`` sums gradients and denominators over replicas in place (the Ray path); the
        single-process trainer holds every micro-batch of the step itself and passes none.
        A replica whose loss was not finite sends a NaN denominator, so the reduced
        denominator, and with it the decision to skip, is the same on every replica.
        """
        denominator = math.nan if self.local_nonfinite else self.local_denominator
        if self.sharded is not None:  # every rank's sum, each shard's slice of it
            denominator = self.sharded(denominator)
        elif reduce is not None:  # a replica without micro-batches adds its zero gradients
            denominator = reduce([p.grad for p in self.model.parameters()], denominator)
        norm, skipped = apply_update(self.model, self.optimizer, self.scheduler, denominator,
                                     self.optim.grad_clip)
        if self.sharded is not None:
            fsdp.gather(self.model)  # the next step's micro-batches run without collectives
        self.local_denominator = 0.0
        self.local_nonfinite = False
        self.steps_done += 1
        self.skipped_steps += skipped
        return StepOutcome(denominator, norm, skipped)

    def state_dict(self) -> dict:
        """A replica's whole state in the format before DCP (drafter.pt; checkpoints are
        written by pipeline/checkpoint/sharded.py now, this reads back as they did)."""
        assert self.sharded is None, "a sharded drafter's state is saved through DCP"
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                **self.rest_state()}

    def rest_state(self) -> dict:
        """What a resume needs beside the weights and AdamW state: the same on every rank."""
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and self.device == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state()
        return {"scheduler": self.scheduler.state_dict(), "steps_done": self.steps_done,
                "rng": rng}

    def load_state_dict(self, state: dict) -> None:
        """A whole state (:meth:`state_dict`; the checkpoints' drafter.pt before DCP)."""
        if self.sharded is not None:  # every rank read the whole state: each keeps its shard
            fsdp.load_full_state(self.model, self.optimizer, state["model"], state["optimizer"])
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.load_rest_state(state)

    def load_rest_state(self, state: dict) -> None:
        """After the weights and AdamW state: the schedule, steps done and RNG."""
        self.scheduler.load_state_dict(state["scheduler"])
        reapply_config(self.optimizer, self.scheduler, self.optim)
        self.steps_done = state["steps_done"]
        torch.set_rng_state(state["rng"]["cpu"])
        if "cuda" in state["rng"] and self.device == "cuda":
            torch.cuda.set_rng_state(state["rng"]["cuda"])

    def take_totals(self) -> StepTotals:
        totals, self.totals = self.totals, StepTotals()
        return totals

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]
