"""The target: a Qwen3ForCausalLM trained from scratch, for a fixed wall-clock budget.

Each training sequence is one ChatML exchange cut from the token stream::

    <|im_start|>user\\n {U tokens} <|im_end|>\\n<|im_start|>assistant\\n {the next A tokens} <|im_end|>\\n

with U drawn per batch and A filling the sequence, so every batch has the same shape (no
padding, one compiled graph) and the model learns that an assistant answers a code prefix by
continuing it. The step count is fitted to the budget once the step time is known (after the
compile), capped at ``target_max_epochs`` passes over the training tokens, and the learning
rate follows warmup + cosine over those steps.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import torch

from bench.quality.scale import Scale
from pipeline.assets.target import chat_pieces

log = logging.getLogger(__name__)

_TIMED_AFTER = 5  # steps left out of the step time: compile and warm-up
_REFIT_AT = (10, 60)  # steps after which the step count is fitted to the budget


@dataclass
class TargetRun:
    params: int
    steps: int
    tokens_seen: int
    train_s: float
    losses: list[tuple[int, float]]  # (step, training loss), every few steps
    heldout_loss: float = float("nan")


class ChatWindows:
    """Batches of chat-formed windows of a token stream, as described in the module doc."""

    def __init__(self, tokenizer, stream: torch.Tensor, scale: Scale, seed: int) -> None:
        self.head, self.middle, self.tail = (torch.tensor(p, dtype=torch.long)
                                             for p in chat_pieces(tokenizer))
        self.stream = stream.long()
        self.scale = scale
        self.body = scale.seq_len - len(self.head) - len(self.middle) - len(self.tail)
        if self.body <= scale.user_tokens[1] + 1:
            raise ValueError(f"seq_len={scale.seq_len} leaves {self.body} tokens for text, "
                             f"fewer than user_tokens[1]={scale.user_tokens[1]} + 1")
        if len(stream) <= self.body:
            raise ValueError(f"a token stream of {len(stream)} tokens is shorter than one "
                             f"window of {self.body}")
        self.generator = torch.Generator().manual_seed(seed)

    def batch(self, batch_size: int, n_user: int | None = None) -> torch.Tensor:
        lo, hi = self.scale.user_tokens
        if n_user is None:
            n_user = int(torch.randint(lo, hi + 1, (), generator=self.generator))
        starts = torch.randint(0, len(self.stream) - self.body, (batch_size,),
                               generator=self.generator)
        rows = []
        for s in starts.tolist():
            text = self.stream[s:s + self.body]
            rows.append(torch.cat([self.head, text[:n_user], self.middle, text[n_user:],
                                   self.tail]))
        return torch.stack(rows)


def _lr_at(step: int, total: int, scale: Scale) -> float:
    if step < scale.warmup_steps:
        return scale.lr * (step + 1) / scale.warmup_steps
    progress = min(1.0, (step - scale.warmup_steps) / max(1, total - scale.warmup_steps))
    return scale.lr * (scale.min_lr_ratio + (1 - scale.min_lr_ratio)
                       * 0.5 * (1 + math.cos(math.pi * progress)))


def _loss_fn(model, compile_it: bool):
    def loss(batch: torch.Tensor) -> torch.Tensor:
        return model(input_ids=batch, labels=batch).loss
    if not compile_it:
        return loss
    return torch.compile(loss)


def epoch_steps(windows: ChatWindows, scale: Scale) -> int:
    """Steps in which the target sees ``scale.target_max_epochs`` times its stream's tokens."""
    return max(1, int(scale.target_max_epochs * len(windows.stream)
                      / (scale.batch_size * windows.body)))


def train(model, windows: ChatWindows, scale: Scale) -> TargetRun:
    """Train in place for ``scale.target_train_s`` seconds of wall clock, or for
    ``scale.target_max_epochs`` passes over the stream if that comes first."""
    dev = scale.device
    model.to(dev).train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": scale.weight_decay},
         {"params": other, "weight_decay": 0.0}],
        lr=scale.lr, betas=(0.9, 0.95), fused=dev == "cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev == "cuda")
    loss_of = _loss_fn(model, scale.compile_target)
    run = TargetRun(sum(p.numel() for p in model.parameters()), 0, 0, 0.0, [])
    cap = epoch_steps(windows, scale)
    total = cap  # fitted below to the time budget once the step time is known
    start = time.perf_counter()
    timed_from = None
    step = 0
    while time.perf_counter() - start < scale.target_train_s and step < total:
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, min(total, 10**6), scale)
        batch = windows.batch(scale.batch_size).to(dev, non_blocking=True)
        with autocast:
            try:
                loss = loss_of(batch)
            except Exception:  # a compile failure must not cost the GPU run: go eager
                if step > 0 or not scale.compile_target:
                    raise
                log.exception("target: torch.compile failed; training eagerly")
                loss_of = _loss_fn(model, False)
                loss = loss_of(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        run.tokens_seen += batch.numel()
        if step == _TIMED_AFTER:
            _sync(dev)
            timed_from = time.perf_counter()
        if step in _REFIT_AT:  # early for the schedule's sake, again once steady
            total = min(cap, _fit_steps(step, timed_from, start, scale))
        if step % 25 == 0 or step == 1:
            value = loss.item()
            run.losses.append((step, value))
            log.info("target step %d/%s loss %.3f lr %.2e %.0fs", step,
                     total if total < 10**9 else "?", value, optimizer.param_groups[0]["lr"],
                     time.perf_counter() - start)
    _sync(dev)
    run.steps, run.train_s = step, time.perf_counter() - start
    if step and (not run.losses or run.losses[-1][0] != step):
        run.losses.append((step, loss.item()))
    model.eval()
    return run


def _fit_steps(step: int, timed_from: float, start: float, scale: Scale) -> int:
    """Steps that fit the budget at the step time measured over the last few steps."""
    _sync(scale.device)
    now = time.perf_counter()
    per_step = (now - timed_from) / (step - _TIMED_AFTER)
    left = scale.target_train_s - (now - start)
    total = step + max(0, int(left / per_step))
    log.info("target: %.3f s/step after warm-up -> %d steps in %.0f s", per_step, total,
             scale.target_train_s)
    return total


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def heldout_loss(model, windows: ChatWindows, scale: Scale) -> float:
    """Mean next-token loss (nats/token) over chat-formed windows of held-out files."""
    dev = scale.device
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev == "cuda")
    total, count = 0.0, 0
    n_user = sum(scale.user_tokens) // 2
    per_batch = max(1, scale.batch_size // 2)
    while count < scale.heldout_eval_tokens:
        batch = windows.batch(per_batch, n_user).to(dev)
        with autocast:
            loss = model(input_ids=batch, labels=batch).loss
        n = batch.shape[0] * (batch.shape[1] - 1)
        total += loss.float().item() * n
        count += n
    return total / count
