"""One micro-batch through the drafter: the training forward and its loss parts.

Both the single-process trainer and the Ray drafter workers call :func:`drafter_loss`, so the
two paths cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from pipeline.model.config import DrafterConfig, DrafterSpec
from pipeline.model.drafter import embed_tokens
from pipeline.model.target import TargetHead
from pipeline.objective.anchors import Anchors, sample_anchors
from pipeline.objective.blocks import build_blocks
from pipeline.objective.linear_ce import Distill
from pipeline.objective.loss import LossParts, Teacher, chunked_loss
from pipeline.objective.masks import build_mask


# Fewest queries (anchor blocks x block size) compiled flex attention has a kernel for.
FLEX_MIN_QUERIES = 128


@dataclass(frozen=True)
class Objective:
    """Everything the loss needs to know, resolved from the drafter spec and options."""

    block_size: int
    mask_token_id: int
    num_anchors: int
    gamma: Optional[float]  # None: no decay (D-PACE weights instead)
    attention: str
    loss_chunk_size: int
    static_shapes: bool
    dpace_alpha: Optional[float] = None  # None: no D-PACE weights
    distill: Optional[Distill] = None  # None: cross-entropy alone

    @classmethod
    def from_config(cls, spec: DrafterSpec, cfg: DrafterConfig) -> "Objective":
        dpace = cfg.position_weights == "dpace"
        return cls(block_size=spec.block_size, mask_token_id=spec.mask_token_id,
                   num_anchors=cfg.num_anchors,
                   gamma=None if dpace else cfg.resolved_gamma(),
                   attention=cfg.attention, loss_chunk_size=cfg.loss_chunk_size,
                   static_shapes=cfg.static_shapes,
                   dpace_alpha=cfg.dpace_alpha if dpace else None,
                   distill=Distill(cfg.distill_weight, cfg.distill_temperature)
                   if cfg.distills else None)

    def anchors(self, loss_mask: torch.Tensor, sample_ids, seed: int, epoch: int) -> Anchors:
        """Per row up to ``num_anchors``; static shapes pad them to min(num_anchors, S), which
        fixes the anchor width per padded length S (a sample has fewer than S anchors).

        Flex attention pads to at least FLEX_MIN_QUERIES queries: compiled flex (torch 2.11,
        CUDA) has no kernel for fewer (NoValidChoicesError), which a micro-batch of short
        samples at block 8 reaches. The padding blocks have keep=False and weigh nothing."""
        pad_to = min(self.num_anchors, loss_mask.shape[1]) if self.static_shapes else None
        floor = -(-FLEX_MIN_QUERIES // self.block_size) if self.attention == "flex" else 1
        return sample_anchors(loss_mask, sample_ids, self.num_anchors, seed, epoch, pad_to,
                              min_width=floor)


def drafter_loss(drafter: Callable[..., torch.Tensor], head: TargetHead, objective: Objective,
                 features: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                 anchors: Anchors, compute_dtype: Optional[torch.dtype] = None,
                 context_positions: Optional[torch.Tensor] = None) -> LossParts:
    """Loss parts of one micro-batch; ``features`` are the target's taps [N, S, n_taps*H],
    and when distilling its final normed hidden state after them ([N, S, (n_taps+1)*H]).

    A packed micro-batch (packing.py) passes its per-document ``context_positions``.
    """
    n, seq_len = input_ids.shape
    teacher_hidden = None
    if objective.distill is not None:
        width = head.lm_head.shape[1]
        features, teacher_hidden = features[..., :-width], features[..., -width:]
    blocks = build_blocks(input_ids, loss_mask, anchors, objective.block_size,
                          objective.mask_token_id, objective.gamma)
    mask = build_mask(anchors.positions, seq_len, objective.block_size, objective.attention,
                      anchors.starts)
    if context_positions is None:
        context_positions = torch.arange(seq_len, device=input_ids.device).expand(n, seq_len)
    embeds = embed_tokens(head.embed, blocks.token_ids, compute_dtype, head.embed_scale)
    hidden = drafter(features, embeds, context_positions, blocks.positions, mask)
    teacher = None if teacher_hidden is None else Teacher(
        teacher_hidden, blocks.teacher_positions, objective.distill)
    return chunked_loss(hidden, head.lm_head, blocks.labels, blocks.weights, blocks.supervised,
                        objective.block_size, objective.loss_chunk_size,
                        objective.dpace_alpha, teacher)
