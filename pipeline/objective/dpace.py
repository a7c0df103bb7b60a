"""D-PACE position weights (arXiv 2605.18810): weigh each block position by how much the
block's expected acceptance length depends on it.

With the draft's own confidence ``q_k = exp(-CE_k)`` at block position k >= 1, smoothed to
``q~_k = alpha + (1 - alpha) q_k``, the chance that positions 1..j are all accepted is taken
as ``C_j = q~_1 ... q~_j`` and the expected acceptance length as ``sum_j C_j``. Its derivative
with respect to ``log q_j`` is ``sum_{m >= j} C_m``: the weight of position j. The weights are
computed without gradient; they reweight the cross-entropy and add none of their own.

An unsupervised position ends the chain (``C`` is 0 from there on): speculative decoding
never accepts past the end of what the target generated, so a position after it adds nothing
to the acceptance length and gets weight 0. ModelOpt (``_dpace_position_weights``) and
speculators (``dpace_loss_decay``) instead let an unsupervised position pass with ``q~ = 1``;
the two agree on every block whose unsupervised positions are all at its end (a block running
past the answer or the document, a padding block), and differ only where supervision resumes
inside a block (the next assistant turn after a short user turn).
"""

from __future__ import annotations

import torch


@torch.no_grad()
def dpace_weights(ce: torch.Tensor, supervised: torch.Tensor, alpha: float) -> torch.Tensor:
    """[..., B] weights from per-position cross-entropy ``ce`` and ``supervised`` [..., B].

    Position 0 (the anchor) is never scored and weighs 0; it does not end the chain.
    """
    q = torch.exp(-ce[..., 1:].to(torch.promote_types(ce.dtype, torch.float32)))
    smoothed = torch.where(supervised[..., 1:], alpha + (1.0 - alpha) * q, 0.0)
    reach = torch.cumprod(smoothed, dim=-1)  # C_j: zero from the first unsupervised position
    # sum_{m >= j} C_m, summed from the block's end: exactly 0 past the chain's end (a total
    # minus a prefix would leave rounding noise there).
    after = reach.flip(-1).cumsum(dim=-1).flip(-1)
    return torch.cat([torch.zeros_like(after[..., :1]), after], dim=-1)
