"""The drafter forward compiles as one graph (no graph break) with either mask, under autocast."""

import pytest
import torch

from pipeline.model.drafter import embed_tokens
from pipeline.objective.masks import build_mask


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_drafter_forward_has_no_graph_break(drafter_setup, attention):
    drafter, _, head, _, _ = drafter_setup
    drafter = drafter.requires_grad_(False)  # flex has no CPU backward; the forward is the graph
    anchors = torch.tensor([[3, 7, 11, 15, 0, 0], [2, 5, 9, 12, 18, 20]])
    positions = (anchors[:, :, None] + torch.arange(4)).flatten(1)
    tokens = torch.randint(0, 90, positions.shape)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            explained = torch._dynamo.explain(drafter)(
                torch.randn(2, 24, 96), embed_tokens(head.embed, tokens, torch.bfloat16),
                torch.arange(24).expand(2, 24), positions, build_mask(anchors, 24, 4, attention))
    finally:
        drafter.requires_grad_(True)
        torch._dynamo.reset()
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
    assert explained.graph_count == 1
