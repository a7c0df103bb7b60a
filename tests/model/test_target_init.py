"""drafter.init=target_layers: the drafter starts from the target's own decoder layers."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.model.config import DrafterConfig, build_drafter_spec
from pipeline.model.target_init import TargetInit, target_init_of
from pipeline.training.drafter_trainer import build_drafter

from tests.conftest import MASK_ID

OPTIONS = dict(num_layers=2, block_size=4, num_taps=3, mask_token_id=MASK_ID)


def _spec_and_init(target_config, target_dir, **over):
    options = DrafterConfig(**{**OPTIONS, **over})
    spec = build_drafter_spec(target_config, options)
    return spec, target_init_of(options, spec, str(target_dir))


def _target_weights(target_dir):
    return load_file(str(target_dir / "model.safetensors"))


def test_copied_layers_equal_the_targets_last_layers(random_target_dir, target_config):
    spec, init = _spec_and_init(target_config, random_target_dir, init="target_layers")
    assert init == TargetInit(str(random_target_dir), (4, 5))  # a 6-layer target
    drafter = build_drafter(spec, seed=0, device="cpu", init=init).state_dict()
    target = _target_weights(random_target_dir)
    copied = [n for n in drafter if n.startswith("layers.")]
    assert len(copied) == 2 * 11
    for name in copied:
        j, rest = name.split(".", 2)[1:]
        torch.testing.assert_close(drafter[name], target[f"model.layers.{4 + int(j)}.{rest}"],
                                   rtol=0, atol=0)
    torch.testing.assert_close(drafter["norm.weight"], target["model.norm.weight"],
                               rtol=0, atol=0)
    # What the target has no counterpart for keeps the seeded random init.
    random = build_drafter(spec, seed=0, device="cpu").state_dict()
    for name in ("fc.weight", "hidden_norm.weight"):
        torch.testing.assert_close(drafter[name], random[name], rtol=0, atol=0)


def test_chosen_layer_ids(random_target_dir, target_config):
    spec, init = _spec_and_init(target_config, random_target_dir, init="target_layers",
                                init_layer_ids=[3, 1])
    drafter = build_drafter(spec, seed=0, device="cpu", init=init).state_dict()
    target = _target_weights(random_target_dir)
    for j, layer in enumerate([3, 1]):
        torch.testing.assert_close(drafter[f"layers.{j}.mlp.up_proj.weight"],
                                   target[f"model.layers.{layer}.mlp.up_proj.weight"])


def test_the_copy_follows_the_targets_weights(random_target_dir, target_config, tmp_path):
    """Perturb one weight of the target's layer 5: the drafter's layer 1 follows it, and a
    random init (or another seed's) matches neither, so the copy is really the target's."""
    folder = tmp_path / "target"
    folder.mkdir()
    for f in random_target_dir.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    weights = _target_weights(random_target_dir)
    name = "model.layers.5.self_attn.q_proj.weight"
    weights[name] = weights[name] + 0.5
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})

    spec, before = _spec_and_init(target_config, random_target_dir, init="target_layers")
    _, after = _spec_and_init(target_config, folder, init="target_layers")
    w0 = build_drafter(spec, seed=0, device="cpu", init=before).state_dict()
    w1 = build_drafter(spec, seed=0, device="cpu", init=after).state_dict()
    key = "layers.1.self_attn.q_proj.weight"
    torch.testing.assert_close(w1[key] - w0[key], torch.full_like(w0[key], 0.5))
    torch.testing.assert_close(w1["layers.0.mlp.up_proj.weight"],
                               w0["layers.0.mlp.up_proj.weight"], rtol=0, atol=0)
    random = build_drafter(spec, seed=0, device="cpu").state_dict()
    assert not torch.allclose(random[key], w0[key])
    assert not torch.allclose(random["layers.0.mlp.up_proj.weight"],
                              w0["layers.0.mlp.up_proj.weight"])


def test_random_init_is_unchanged(random_target_dir, target_config):
    spec, init = _spec_and_init(target_config, random_target_dir)
    assert init is None


@pytest.mark.parametrize("over, message", [
    (dict(init="copy"), r"drafter.init='copy' is not allowed: expected one of \['random', "
                        r"'target_layers'\]"),
    (dict(init_layer_ids=[4, 5]), r"drafter.init_layer_ids=\[4, 5\] is not allowed: expected "
                                  r"null unless drafter.init=target_layers"),
    (dict(init="target_layers", init_layer_ids=[5]), r"drafter.init_layer_ids=\[5\] .*one "
                                                     r"target layer id per drafter layer \(2\)"),
])
def test_bad_options_are_refused(over, message):
    with pytest.raises(ValueError, match=message):
        DrafterConfig(**{**OPTIONS, **over})


@pytest.mark.parametrize("over, message", [
    (dict(init_layer_ids=[4, 6]), r"drafter.init_layer_ids=\[4, 6\] has ids \[6\] outside the "
                                  r"target's 6 layers"),
    (dict(num_layers=7, num_taps=3), r"drafter.num_layers=7 <= the target's 6 layers"),
])
def test_layer_ids_are_checked_against_the_target(target_config, over, message):
    with pytest.raises(ValueError, match=message):
        build_drafter_spec(target_config, DrafterConfig(**{**OPTIONS, "init": "target_layers",
                                                           **over}))


@pytest.mark.parametrize("model_type", ["gemma3_text", "mistral"])
def test_targets_of_other_layer_kinds_are_refused(target_config, model_type):
    """Gemma's layers carry Qwen3's parameter names but not its norms: refused by family."""
    with pytest.raises(ValueError, match=rf"model_type='{model_type}'.*drafter.init=random"):
        build_drafter_spec({**target_config, "model_type": model_type},
                           DrafterConfig(**{**OPTIONS, "init": "target_layers"}))


@pytest.mark.parametrize("key", ["attention_bias", "mlp_bias"])
def test_llama_layers_with_biases_are_refused(target_config, key):
    """A copy would drop the biases the drafter's layers have no place for."""
    with pytest.raises(ValueError, match=rf"biases \({key}=true\).*drafter.init=random"):
        build_drafter_spec({**target_config, "model_type": "llama", key: True},
                           DrafterConfig(**{**OPTIONS, "init": "target_layers"}))


def test_llama_layers_are_copied_but_for_the_qk_norms(family_target, caplog):
    """A Llama layer is a Qwen3 layer without q/k norms: every other weight of the target's
    last layers is copied exactly, the q/k norms keep the seeded init, and one line says so."""
    import logging
    from pathlib import Path

    from transformers import AutoConfig

    from pipeline.model.target import weight_files

    folder = Path(family_target("llama"))
    config = AutoConfig.from_pretrained(folder).to_dict()
    spec, init = _spec_and_init(config, folder, init="target_layers")
    last = config["num_hidden_layers"]
    assert init.layer_ids == (last - 2, last - 1)
    with caplog.at_level(logging.INFO, logger="pipeline.model.target_init"):
        drafter = build_drafter(spec, seed=0, device="cpu", init=init).state_dict()
    assert "llama layers have no" in caplog.text
    random = build_drafter(spec, seed=0, device="cpu").state_dict()
    target = {}
    for file in set(weight_files(folder).values()):
        target.update(load_file(str(file)))
    kept, copied = [], []
    for name in (n for n in drafter if n.startswith("layers.")):
        j, rest = name.split(".", 2)[1:]
        source = f"model.layers.{init.layer_ids[int(j)]}.{rest}"
        if rest.endswith(("q_norm.weight", "k_norm.weight")):
            assert source not in target
            torch.testing.assert_close(drafter[name], random[name], rtol=0, atol=0)
            kept.append(name)
        else:
            torch.testing.assert_close(drafter[name], target[source], rtol=0, atol=0)
            copied.append(name)
    assert len(kept) == 2 * 2 and len(copied) == 2 * 9
    assert not torch.allclose(random["layers.1.mlp.up_proj.weight"],
                              drafter["layers.1.mlp.up_proj.weight"])
    torch.testing.assert_close(drafter["norm.weight"], target["model.norm.weight"])
