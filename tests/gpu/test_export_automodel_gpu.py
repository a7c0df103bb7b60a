"""An exported drafter, loaded with AutoModel(trust_remote_code=True) onto the GPU, computes
what the pipeline's drafter computes there (CPU version: tests/serving/test_modeling_dflash.py)."""

import pytest
import torch
from transformers import AutoModel

from pipeline.model.serving_format import save_drafter
from pipeline.model.drafter import embed_tokens
from pipeline.objective.masks import build_mask

# export dtype -> (relative error allowed, relative change a one-position shift must cause)
CASES = {"float32": (1e-4, 1e-2), "bfloat16": (2e-2, 0.1)}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.fixture()
def trained(drafter_setup):
    """The fixture's drafter with every weight moved off its init, norms included."""
    drafter, _, head, spec, _ = drafter_setup
    torch.manual_seed(2)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return drafter, head, spec


def inputs(head, spec, device, context_len=40, num_anchors=6):
    """Training-shaped inputs: blocks at sorted anchors, and the training mask."""
    g = torch.Generator().manual_seed(3)
    anchors = torch.sort(torch.randperm(context_len - 1, generator=g)[:num_anchors] + 1).values
    anchors = anchors.expand(2, -1)
    features = torch.randn(2, context_len, spec.feature_size, generator=g)
    tokens = torch.full((2, num_anchors, spec.block_size), spec.mask_token_id)
    tokens[:, :, 0] = torch.randint(0, 90, (2, num_anchors), generator=g)
    embeds = embed_tokens(head.embed, tokens.flatten(1))
    ctx_pos = torch.arange(context_len).expand(2, -1)
    block_pos = (anchors[:, :, None] + torch.arange(spec.block_size)).flatten(1)
    mask = build_mask(anchors, context_len, spec.block_size, "sdpa")
    return [t.to(device) for t in (features, embeds, ctx_pos, block_pos, mask)]


@pytest.mark.parametrize("dtype", list(CASES))
def test_automodel_on_gpu_matches_the_pipeline_drafter(trained, tmp_path, device, dtype):
    drafter, head, spec = trained
    tol, sharp = CASES[dtype]
    torch_dtype = getattr(torch, dtype)
    out = save_drafter(drafter, tmp_path / "export", dtype)
    loaded = AutoModel.from_pretrained(out, trust_remote_code=True, dtype=torch_dtype)
    loaded = loaded.to(device).eval()
    ours = drafter.to(device, torch_dtype).eval()
    assert type(loaded).__name__ == "DFlashDraftModel"
    assert all(p.device.type == device and p.dtype == torch_dtype for p in loaded.parameters())
    for name, weight in ours.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], weight), name
    lm_head = head.lm_head.to(device, torch_dtype)
    features, embeds, ctx_pos, block_pos, mask = inputs(head, spec, device)
    embeds = embeds.to(torch_dtype)
    for attention_mask in (None, mask):
        with torch.no_grad():
            ref_hidden = ours(features, embeds, ctx_pos, block_pos, attention_mask)
            hidden = loaded(position_ids=torch.cat([ctx_pos, block_pos], dim=1),
                            noise_embedding=embeds, target_hidden=features.to(torch_dtype),
                            attention_mask=attention_mask)
            moved = loaded(position_ids=torch.cat([ctx_pos, block_pos + 1], dim=1),
                           noise_embedding=embeds, target_hidden=features.to(torch_dtype),
                           attention_mask=attention_mask)
        assert hidden.device.type == device and hidden.dtype == torch_dtype
        logits, ref_logits, moved_logits = (h.float() @ lm_head.float().T
                                            for h in (hidden, ref_hidden, moved))
        assert rel(hidden, ref_hidden) < tol and rel(logits, ref_logits) < tol
        if dtype == "float32":
            torch.testing.assert_close(logits, ref_logits, rtol=1e-3, atol=1e-3)
        # The comparison is sharp enough to see the block moved one position.
        assert rel(moved_logits, ref_logits) > sharp
