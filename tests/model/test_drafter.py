import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from pipeline.model.config import (DrafterConfig, DrafterSpec, build_drafter_spec,
                                   default_tap_ids, qwen3_8b_config)
from pipeline.model.drafter import DFlashDrafter
from pipeline.model.serving_format import save_drafter

LAYER_KEYS = sorted([
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "input_layernorm.weight", "post_attention_layernorm.weight",
])


def expected_names(num_layers):
    names = [f"layers.{i}.{k}" for i in range(num_layers) for k in LAYER_KEYS]
    return sorted(names + ["fc.weight", "hidden_norm.weight", "norm.weight"])


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def load_drafter(path, dtype: torch.dtype = torch.float32) -> DFlashDrafter:
    """Rebuild a drafter from an exported folder; every weight must be present (the
    export format's round trip: servers load it with their own code)."""
    path = Path(path)
    spec = DrafterSpec.from_hf_config(json.loads((path / "config.json").read_text()))
    model = DFlashDrafter.for_loading(spec, "cpu")
    state = load_file(str(path / "model.safetensors"), device="cpu")
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True, assign=True)
    return model


def test_a_drafter_built_for_loading_holds_what_the_original_holds(drafter_setup):
    """No random weights drawn, yet after the load every parameter and buffer (the rotary
    tables no state dict holds among them) equals the original's."""
    drafter, _, _, spec, _ = drafter_setup
    loaded = DFlashDrafter.for_loading(spec, "cpu")
    loaded.load_state_dict(drafter.state_dict(), strict=True)
    want = {**dict(drafter.named_parameters()), **dict(drafter.named_buffers())}
    got = {**dict(loaded.named_parameters()), **dict(loaded.named_buffers())}
    assert got.keys() == want.keys() and any("rotary" in k for k in want)
    for name, t in want.items():
        assert torch.equal(got[name], t), name


def test_default_tap_ids():
    assert default_tap_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_tap_ids(36, 1) == [18]
    assert default_tap_ids(6, 3) == [1, 2, 3]


def test_qwen3_8b_drafter_names_and_count_on_meta():
    spec = build_drafter_spec(qwen3_8b_config(), DrafterConfig(num_layers=5, block_size=16),
                              tokenizer_mask_id=151669)
    with torch.device("meta"):
        model = DFlashDrafter(spec)
    assert sorted(model.state_dict()) == expected_names(5)
    h, kv, inter = 4096, 8 * 128, 12288
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * 128 + 2 * h
    assert count_parameters(model) == 5 * per_layer + 5 * h * h + 2 * h == 1_048_626_432
    assert spec.target_layer_ids == (1, 9, 17, 25, 33)
    cfg = spec.hf_config
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert cfg["block_size"] == 16 and cfg["num_target_layers"] == 36
    assert cfg["dflash_config"] == {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}
    assert cfg["layer_types"] == ["full_attention"] * 5
    assert cfg["num_hidden_layers"] == 5 and cfg["rope_theta"] == 1e6


def test_no_embedding_or_head_stored(drafter_setup):
    drafter = drafter_setup[0]
    assert not any("embed" in n or "lm_head" in n for n in drafter.state_dict())


def test_save_load_roundtrip(drafter_setup, tmp_path):
    drafter, _, _, spec, _ = drafter_setup
    out = save_drafter(drafter, tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and config["dflash_config"]["mask_token_id"] == 95
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert sorted(f.keys()) == expected_names(2)
        assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in f.keys())
    loaded = load_drafter(out)
    for name, t in drafter.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], t.to(torch.bfloat16).float())
    assert loaded.spec.target_layer_ids == spec.target_layer_ids


@pytest.mark.parametrize("key,value,match", [
    ("block_size", 1, "drafter.block_size"),
    ("attention", "xformers", "drafter.attention"),
    ("compile", "max", "drafter.compile"),
])
def test_bad_options_name_the_key(key, value, match):
    with pytest.raises(ValueError, match=match):
        DrafterConfig(**{key: value})


def test_tap_beyond_target_layers_is_rejected():
    with pytest.raises(ValueError, match="target_layer_ids.*allowed 0..34"):
        build_drafter_spec(qwen3_8b_config(), DrafterConfig(target_layer_ids=[1, 40]), 151669)


def test_mask_token_outside_vocab_is_rejected():
    with pytest.raises(ValueError, match="mask_token_id=200000.*0..151935"):
        build_drafter_spec(qwen3_8b_config(), DrafterConfig(mask_token_id=200000))
