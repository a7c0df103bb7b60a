"""The export loads with AutoModel(trust_remote_code=True) as the drafter we trained."""

import ast

import pytest
import torch
from transformers import AutoModel, DynamicCache

from pipeline.model.serving_format import save_drafter
from pipeline.model.drafter import embed_tokens
from pipeline.serving.layout import MODELING_FILE


@pytest.fixture()
def exported(drafter_setup, tmp_path):
    """A drafter with every weight moved off its init (norms included), exported in fp32."""
    drafter, _, head, spec, _ = drafter_setup
    torch.manual_seed(2)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.2 * torch.randn_like(p))
    out = save_drafter(drafter, tmp_path / "export", "float32")
    loaded = AutoModel.from_pretrained(out, trust_remote_code=True, dtype=torch.float32)
    return drafter.eval(), loaded.eval(), head, spec


def _inputs(head, spec, context_len=9):
    """Tap features (random: the drafter only sees their values), a block, positions."""
    torch.manual_seed(3)
    features = torch.randn(2, context_len, spec.feature_size)
    block = torch.full((2, spec.block_size), spec.mask_token_id)
    block[:, 0] = torch.randint(0, 90, (2,))
    embeds = embed_tokens(head.embed, block)
    context_pos = torch.arange(context_len).expand(2, -1)
    block_pos = torch.arange(context_len, context_len + spec.block_size).expand(2, -1)
    return features, embeds, context_pos, block_pos


def _logits(hidden, head):
    return hidden @ head.lm_head.T


def test_automodel_gives_the_drafter_not_a_plain_qwen3(exported):
    drafter, loaded, _, spec = exported
    assert type(loaded).__name__ == "DFlashDraftModel"
    assert loaded.block_size == spec.block_size and loaded.mask_token_id == spec.mask_token_id
    assert loaded.target_layer_ids == list(spec.target_layer_ids)
    theirs = loaded.state_dict()
    assert theirs.keys() == drafter.state_dict().keys()
    for name, weight in drafter.state_dict().items():
        assert torch.equal(theirs[name], weight), name


@pytest.mark.parametrize("masked", [False, True])
def test_same_logits_as_the_pipeline_drafter(exported, masked):
    drafter, loaded, head, spec = exported
    features, embeds, context_pos, block_pos = _inputs(head, spec)
    mask = None
    if masked:  # the training mask's shape: block queries over [context | block] keys
        torch.manual_seed(4)
        keys = features.shape[1] + spec.block_size
        mask = torch.rand(2, 1, spec.block_size, keys) < 0.6
        mask[..., features.shape[1]:] = True
    with torch.no_grad():
        ours = _logits(drafter(features, embeds, context_pos, block_pos, mask), head)
        theirs = _logits(loaded(position_ids=torch.cat([context_pos, block_pos], dim=1),
                                noise_embedding=embeds, target_hidden=features,
                                attention_mask=mask), head)
        moved = _logits(loaded(position_ids=torch.cat([context_pos, block_pos + 1], dim=1),
                               noise_embedding=embeds, target_hidden=features,
                               attention_mask=mask), head)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
    # The comparison is sharp enough to see the block moved one position off its context.
    assert (moved - ours).abs().max() > 1e-3


def test_cached_context_gives_the_same_logits(exported):
    """Decoding style: the context arrives in two calls through a KV cache."""
    drafter, loaded, head, spec = exported
    features, embeds, context_pos, block_pos = _inputs(head, spec)
    first = 5
    cache = DynamicCache()
    with torch.no_grad():
        loaded(position_ids=torch.cat([context_pos[:, :first], block_pos], dim=1),
               noise_embedding=embeds, target_hidden=features[:, :first],
               past_key_values=cache, use_cache=True)
        cache.crop(-spec.block_size)  # drop the block's keys, keep the context's
        theirs = loaded(position_ids=torch.cat([context_pos[:, first:], block_pos], dim=1),
                        noise_embedding=embeds, target_hidden=features[:, first:],
                        past_key_values=cache, use_cache=True)
        ours = drafter(features, embeds, context_pos, block_pos, None)
    torch.testing.assert_close(_logits(theirs, head), _logits(ours, head), rtol=1e-4, atol=1e-4)


def test_modeling_file_is_standalone():
    """It ships inside the checkpoint: torch and transformers only, never our package."""
    tree = ast.parse(MODELING_FILE.read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import in the shipped modeling file"
            roots.add(node.module.split(".")[0])
    assert roots <= {"__future__", "typing", "torch", "transformers"}, roots
