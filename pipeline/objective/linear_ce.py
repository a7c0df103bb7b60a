"""Per-row losses through a frozen LM head, without keeping any logits.

The head is [vocab, hidden] = 151936 x 4096 for Qwen3: 512 anchors x 15 positions x 4 samples
of logits would take 37 GB in fp32. Rows go through the head in chunks; each chunk's losses and
their gradient with respect to the hidden states are computed together in the forward pass, and
the logits are dropped at once. Backward then only scales each stored row gradient by its row's
upstream gradient (the caller's loss weight): rows x hidden, about 0.5% of the logits, so the
head's matmul runs twice per chunk (logits, then the gradient) instead of three times with
recomputation. The head is frozen: no weight gradient.

A row's loss is its cross-entropy, or with distillation (:class:`Distill`)
``(1 - lambda) * CE + lambda * T^2 * KL(p_T || q_T)``, where ``p_T`` is the softmax at
temperature T of the target's logits for that row (its final hidden state through the same
head, computed chunk by chunk here) and ``q_T`` the draft's. The cross-entropy comes back too,
without gradient: D-PACE weights are made from it (dpace.py).

The loss terms are computed in fp32 from bf16 logits; on CUDA that step is one compiled kernel
per kind of row loss, so no fp32 copy of the logits is ever written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

_compiled: dict[str, object] = {}


@dataclass(frozen=True)
class Distill:
    weight: float       # lambda: the KL term's share of a row's loss, in (0, 1]
    temperature: float  # T > 0


@dataclass
class RowLosses:
    loss: torch.Tensor  # [R] fp32 (fp64 for an fp64 head), differentiable: the row's loss
    ce: torch.Tensor    # [R] as loss, no gradient: the row's cross-entropy on its label
    hits: torch.Tensor  # [R] bool: the greedy token is the label


def _hard_terms(x: torch.Tensor, labels: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From fp32 (or fp64) logits ``x``: per-row CE, greedy hits, and d(CE_i)/d(x_i) in x's
    dtype (both row losses start here; inlined where compiled)."""
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    ce = (lse - x.gather(1, labels[:, None])).squeeze(1)
    hit = x.argmax(-1) == labels
    onehot = torch.arange(x.shape[1], device=x.device)[None] == labels[:, None]
    return ce, hit, torch.exp(x - lse) - onehot.float()


def _ce_terms(logits: torch.Tensor, labels: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row CE, greedy hits, and d(CE_i)/d(logits_i) in the logits' dtype."""
    ce, hit, grad = _hard_terms(logits.to(torch.promote_types(logits.dtype, torch.float32)),
                                labels)
    return ce, hit, grad.to(logits.dtype)


def _distill_terms(logits: torch.Tensor, labels: torch.Tensor, teacher: torch.Tensor,
                   weight: float, temperature: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row mixed loss, CE, hits, and d(loss_i)/d(logits_i) in the logits' dtype.

    d(T^2 KL(p_T || q_T))/d(logits) = T (q_T - p_T): the T^2 keeps the soft term's gradient
    on the scale of the hard one's whatever T (Hinton et al. 2015)."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    ce, hit, hard_grad = _hard_terms(x, labels)
    log_q = torch.log_softmax(x / temperature, dim=-1)
    log_p = torch.log_softmax(teacher.to(x.dtype) / temperature, dim=-1)
    p = torch.exp(log_p)
    kl = (p * (log_p - log_q)).sum(-1)
    soft = temperature * temperature * weight
    loss = (1.0 - weight) * ce + soft * kl
    grad = (1.0 - weight) * hard_grad + (temperature * weight) * (torch.exp(log_q) - p)
    return loss, ce, hit, grad.to(logits.dtype)


def _terms_fn(name: str, device_type: str):
    fn = {"ce": _ce_terms, "distill": _distill_terms}[name]
    if device_type != "cuda":
        return fn
    if name not in _compiled:
        # dynamic: the number of supervised rows changes every micro-batch.
        _compiled[name] = torch.compile(fn, dynamic=True)
    return _compiled[name]


class _RowLosses(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, teacher, chunk_size, distill):
        # The products run in the head's dtype, chosen here: autocast would recast them and
        # the gradient buffer (the head's dtype) would no longer match (a bf16 autocast over
        # an fp32 head).
        with torch.autocast(hidden.device.type, enabled=False):
            return _RowLosses._forward(ctx, hidden, weight, labels, teacher, chunk_size,
                                       distill)

    @staticmethod
    def _forward(ctx, hidden, weight, labels, teacher, chunk_size, distill):
        device = hidden.device
        h = hidden.to(weight.dtype)
        grad = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        rows = h.shape[0]
        acc = torch.promote_types(weight.dtype, torch.float32)  # as the terms compute them
        loss = torch.empty(rows, dtype=acc, device=device)
        ce = torch.empty(rows, dtype=acc, device=device)
        hits = torch.empty(rows, dtype=torch.bool, device=device)
        terms = _terms_fn("ce" if distill is None else "distill", device.type)
        for start in range(0, rows, chunk_size):
            end = min(start + chunk_size, rows)
            logits = h[start:end] @ weight.t()
            if distill is None:
                ce[start:end], hits[start:end], dlogits = terms(logits, labels[start:end])
                loss[start:end] = ce[start:end]
            else:
                target = teacher[start:end].to(weight.dtype) @ weight.t()
                loss[start:end], ce[start:end], hits[start:end], dlogits = terms(
                    logits, labels[start:end], target, distill.weight, distill.temperature)
                del target
            del logits
            if grad is not None:
                torch.mm(dlogits, weight, out=grad[start:end])
        ctx.save_for_backward(grad)
        ctx.hidden_dtype = hidden.dtype
        ctx.mark_non_differentiable(ce, hits)
        return loss, ce, hits

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_hits):
        (grad,) = ctx.saved_tensors
        if grad is None:
            return None, None, None, None, None, None
        scaled = grad * grad_loss[:, None].to(grad.dtype)
        return scaled.to(ctx.hidden_dtype), None, None, None, None, None


def row_losses(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
               chunk_size: int, teacher: Optional[torch.Tensor] = None,
               distill: Optional[Distill] = None) -> RowLosses:
    """Per-row losses of rows ``hidden`` [R, H] scored by the head ``weight`` [V, H] against
    ``labels`` [R]; with ``distill``, ``teacher`` [R, H] holds each row's target hidden state
    (the target's logits are ``teacher @ weight.T``). ``weight`` is frozen."""
    assert (teacher is None) == (distill is None), "distillation needs the target's rows"
    if hidden.shape[0] == 0:
        zero = hidden.sum(dim=-1, dtype=torch.float32) * 0.0  # [0], still in the graph
        return RowLosses(zero, zero.detach(), torch.zeros(0, dtype=torch.bool,
                                                          device=hidden.device))
    loss, ce, hits = _RowLosses.apply(hidden, weight.detach(), labels, teacher, chunk_size,
                                      distill)
    return RowLosses(loss, ce, hits)
