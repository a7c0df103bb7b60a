"""The export writes exactly the tensors loaders fill, or stops with their names."""

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.model.serving_format import save_drafter
from pipeline.model.config import DrafterConfig, build_drafter_spec, qwen3_8b_config
from pipeline.model.drafter import DFlashDrafter
from pipeline.serving.layout import ExportError, check_config, expected_tensors, verify_export


@pytest.mark.parametrize("bias", [False, True])
def test_expected_set_is_the_drafters_state_dict(bias):
    """Derived from config.json alone, as SGLang/vLLM do, for the Qwen3-8B recipe."""
    target = dict(qwen3_8b_config(), attention_bias=bias)
    spec = build_drafter_spec(target, DrafterConfig(num_layers=5), 151669)
    with torch.device("meta"):
        model = DFlashDrafter(spec)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    assert shapes == expected_tensors(spec.hf_config)
    assert ("layers.4.self_attn.q_proj.bias" in shapes) == bias
    assert shapes["fc.weight"] == (4096, 5 * 4096)


def test_a_persistent_rope_buffer_stops_the_export(drafter_setup, tmp_path):
    drafter = drafter_setup[0]
    rotary = drafter.rotary_emb
    rotary.register_buffer("inv_freq", rotary.inv_freq.clone(), persistent=True)
    with pytest.raises(ExportError, match=r"1 unexpected: rotary_emb\.inv_freq.*random weights"):
        save_drafter(drafter, tmp_path / "export", "float32")
    assert not (tmp_path / "export").exists()  # checked before anything is written


def test_a_renamed_module_stops_the_export(drafter_setup, tmp_path):
    drafter = drafter_setup[0]
    drafter.add_module("context_norm", drafter._modules.pop("hidden_norm"))
    with pytest.raises(ExportError, match=r"1 missing: hidden_norm\.weight; "
                                          r"1 unexpected: context_norm\.weight"):
        save_drafter(drafter, tmp_path / "export", "float32")
    assert not (tmp_path / "export").exists()


def test_weights_that_disagree_with_config_stop_the_export(drafter_setup, tmp_path):
    drafter, spec = drafter_setup[0], drafter_setup[3]
    inner = spec.hf_config["intermediate_size"]
    drafter.spec = dataclasses.replace(spec, hf_config=dict(spec.hf_config,
                                                            intermediate_size=inner + 8))
    with pytest.raises(ExportError, match=r"misshapen: layers\.0\.mlp\.down_proj\.weight"):
        save_drafter(drafter, tmp_path / "export", "float32")


def test_verify_export_reads_the_folder_as_written(drafter_setup, tmp_path):
    out = save_drafter(drafter_setup[0], tmp_path / "export", "bfloat16")
    verify_export(out)  # a clean export passes
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"] == {"AutoModel": "modeling_dflash.DFlashDraftModel"}

    weights = load_file(str(out / "model.safetensors"))
    del weights["fc.weight"]
    save_file(weights, str(out / "model.safetensors"))
    with pytest.raises(ExportError, match=r"1 missing: fc\.weight"):
        verify_export(out)


def test_verify_export_needs_the_modeling_file(drafter_setup, tmp_path):
    out = save_drafter(drafter_setup[0], tmp_path / "export", "bfloat16")
    (out / "modeling_dflash.py").unlink()
    with pytest.raises(ExportError, match="names no modeling file"):
        verify_export(out)


def test_config_with_a_last_layer_tap_is_refused():
    spec = build_drafter_spec(qwen3_8b_config(), DrafterConfig(), 151669)
    config = dict(spec.hf_config, dflash_config={"mask_token_id": 151669,
                                                 "target_layer_ids": [1, 17, 35]})
    with pytest.raises(ExportError, match=r"target_layer_ids=\[1, 17, 35\].*0\.\.34"):
        check_config(config, "drafter")


def test_a_rope_servers_cannot_build_stops_the_export():
    config = dict(build_drafter_spec(qwen3_8b_config(), DrafterConfig(), 151669).hf_config)
    check_config(config, "x")  # the published recipe's rope passes
    config["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 1e6}
    with pytest.raises(ExportError, match=r"rope_type='longrope': servers build the drafter's "
                                          r"Qwen3 layers with one of \['default'"):
        check_config(config, "x")
