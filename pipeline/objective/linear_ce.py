"""Weighted cross-entropy through a frozen LM head, without keeping any logits.

The head is [vocab, hidden] = 151936 x 4096 for Qwen3: 512 anchors x 15 positions x 4 samples
of logits would take 37 GB in fp32. Rows go through the head in chunks; each chunk's loss and
its gradient with respect to the hidden states are computed together in the forward pass, and
the logits are dropped at once. Backward then only scales the stored gradient (rows x hidden,
about 0.5% of the logits), so the head's matmul runs twice per chunk (logits, then the
gradient) instead of three times with recomputation. The head is frozen: no weight gradient.

The loss terms are computed in fp32 from bf16 logits; on CUDA that softmax step is one
compiled kernel, so no fp32 copy of the logits is ever written.
"""

from __future__ import annotations

import torch

_compiled_terms = None


def _terms(logits: torch.Tensor, labels: torch.Tensor,
           weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sum(w * CE), greedy hits, and d(sum(w * CE))/d(logits) in the logits' dtype."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    target = x.gather(1, labels[:, None])
    numerator = ((lse - target).squeeze(1) * weights).sum()
    hit = x.argmax(-1) == labels
    onehot = torch.arange(x.shape[1], device=x.device)[None] == labels[:, None]
    grad = (torch.exp(x - lse) - onehot.float()) * weights[:, None]
    return numerator, hit, grad.to(logits.dtype)


def _terms_fn(device_type: str):
    global _compiled_terms
    if device_type != "cuda":
        return _terms
    if _compiled_terms is None:
        # dynamic: the number of supervised rows changes every micro-batch.
        _compiled_terms = torch.compile(_terms, dynamic=True)
    return _compiled_terms


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, weights, chunk_size):
        # The products run in the head's dtype, chosen here: autocast would recast them and
        # the gradient buffer (the head's dtype) would no longer match (a bf16 autocast over
        # an fp32 head).
        with torch.autocast(hidden.device.type, enabled=False):
            return _LinearCrossEntropy._forward(ctx, hidden, weight, labels, weights,
                                                chunk_size)

    @staticmethod
    def _forward(ctx, hidden, weight, labels, weights, chunk_size):
        terms = _terms_fn(hidden.device.type)
        h = hidden.to(weight.dtype)
        want_grad = ctx.needs_input_grad[0]
        grad = torch.empty_like(h) if want_grad else None
        numerator = torch.zeros((), dtype=torch.float32, device=hidden.device)
        hits = torch.empty(h.shape[0], dtype=torch.bool, device=hidden.device)
        for start in range(0, h.shape[0], chunk_size):
            end = min(start + chunk_size, h.shape[0])
            logits = h[start:end] @ weight.t()
            part, hits[start:end], dlogits = terms(logits, labels[start:end],
                                                   weights[start:end])
            numerator += part
            del logits
            if grad is not None:
                torch.mm(dlogits, weight, out=grad[start:end])
        ctx.save_for_backward(grad)
        ctx.hidden_dtype = hidden.dtype
        ctx.mark_non_differentiable(hits)
        return numerator, hits

    @staticmethod
    def backward(ctx, grad_numerator, _grad_hits):
        (grad,) = ctx.saved_tensors
        if grad is None:
            return None, None, None, None, None
        scaled = grad * grad_numerator.to(grad.dtype)
        return scaled.to(ctx.hidden_dtype), None, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         weights: torch.Tensor, chunk_size: int
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_i w_i * CE(hidden_i @ weight.T, labels_i), greedy hits [R]) for rows [R, H].

    ``weight`` is frozen (no gradient flows to it). ``weights`` are per-row loss weights.
    """
    if hidden.shape[0] == 0:
        zero = hidden.sum(dtype=torch.float32) * 0.0
        return zero, torch.zeros(0, dtype=torch.bool, device=hidden.device)
    return _LinearCrossEntropy.apply(hidden, weight.detach(), labels, weights.float(),
                                     chunk_size)
