"""The drafter's own Qwen3 pieces compute what transformers' Qwen3 classes compute, and building
a drafter for a plain config imports no transformers (a drafter actor's start-up)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pipeline
from pipeline.model import qwen3_parts
from pipeline.model.config import DrafterConfig, build_drafter_spec, qwen3_8b_config
from pipeline.model.drafter import DFlashDrafter


def _spec(**target):
    config = dict(qwen3_8b_config(), hidden_size=64, intermediate_size=96, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, num_hidden_layers=6, **target)
    return build_drafter_spec(config, DrafterConfig(num_layers=2, block_size=4, num_taps=2,
                                                    mask_token_id=1))


def _drafter(spec, monkeypatch, own: bool) -> DFlashDrafter:
    with monkeypatch.context() as m:
        if not own:
            m.setattr(qwen3_parts, "_plain", lambda _: False)
        torch.manual_seed(3)
        return DFlashDrafter(spec)


def _forward_backward(model, spec):
    g = torch.Generator().manual_seed(5)
    feats = torch.randn(2, 10, spec.feature_size, generator=g)
    blocks = torch.randn(2, spec.block_size, spec.hidden_size, generator=g)
    out = model(feats, blocks, torch.arange(10).expand(2, 10),
                (torch.arange(spec.block_size) + 3).expand(2, spec.block_size), None)
    out.sum().backward()
    return out, {name: p.grad for name, p in model.named_parameters()}


def test_own_pieces_match_transformers_qwen3(monkeypatch):
    spec = _spec()
    assert qwen3_parts._plain(spec.hf_config)
    own, hf = _drafter(spec, monkeypatch, True), _drafter(spec, monkeypatch, False)
    assert type(own.rotary_emb).__module__ == qwen3_parts.__name__
    assert type(hf.rotary_emb).__name__ == "Qwen3RotaryEmbedding"
    assert type(hf.layers[0].mlp).__name__ == "Qwen3MLP"
    # Same parameters, buffers and names (the checkpoint and serving formats).
    own_state, hf_state = own.state_dict(), hf.state_dict()
    assert list(own_state) == list(hf_state)
    for name in own_state:
        torch.testing.assert_close(own_state[name], hf_state[name])
    for name in ("inv_freq", "original_inv_freq"):
        torch.testing.assert_close(getattr(own.rotary_emb, name), getattr(hf.rotary_emb, name))
    assert [n for n, _ in own.named_buffers()] == [n for n, _ in hf.named_buffers()]
    own_out, own_grads = _forward_backward(own, spec)
    hf_out, hf_grads = _forward_backward(hf, spec)
    torch.testing.assert_close(own_out, hf_out)
    for name in own_grads:
        torch.testing.assert_close(own_grads[name], hf_grads[name])
    x = torch.randn(3, 8)
    torch.testing.assert_close(qwen3_parts.rotate_half(x), torch.cat([-x[:, 4:], x[:, :4]], -1))


@pytest.mark.parametrize("change", [
    {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                         "original_max_position_embeddings": 4096}},
    {"hidden_act": "gelu"},
])
def test_other_configs_get_transformers_own_classes(change):
    spec = _spec(**change)
    if "hidden_act" in change:  # the drafter's fields always say silu: change the spec's
        spec.hf_config["hidden_act"] = change["hidden_act"]
    assert not qwen3_parts._plain(spec.hf_config)
    config = qwen3_parts.drafter_config(spec.hf_config)
    assert type(config).__name__ == "Qwen3Config"
    assert type(qwen3_parts.rotary_embedding(config)).__name__ == "Qwen3RotaryEmbedding"
    assert type(qwen3_parts.mlp(config)).__name__ == "Qwen3MLP"


@pytest.mark.slow
def test_building_a_plain_drafter_imports_no_transformers():
    code = ("import sys\nfrom pipeline.model.config import DrafterSpec\n"
            "from pipeline.model.drafter import DFlashDrafter\n"
            f"DFlashDrafter(DrafterSpec(**{vars(_spec())!r}))\n"
            "print('transformers' in sys.modules)")
    root = Path(pipeline.__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=root, check=True).stdout.strip()
    assert out == "False"
