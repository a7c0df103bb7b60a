"""bench.h200_families's target builder, at a narrow width on CPU: the folder it writes is a
target the pipeline accepts (its family, its chat format, every layer of the shape)."""

import pytest
from transformers import AutoConfig, AutoTokenizer

import bench.h200_families as families
from pipeline.model.families import family_of

NARROW = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, vocab_size=4200)


@pytest.mark.parametrize("model_type", sorted(families.SHAPES))
def test_built_target_keeps_its_family_and_depth(model_type, tmp_path, monkeypatch):
    name, dims = families.SHAPES[model_type]
    monkeypatch.setitem(families.SHAPES, model_type, (name, {**dims, **NARROW}))
    info = families.build(model_type, tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert config.model_type == model_type
    assert config.num_hidden_layers == dims["num_hidden_layers"]
    assert info["params_b"] > 0 and info["experts"] is not None
    family_of(config.to_dict())  # a supported family, or this raises
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "abc"}], tokenize=False)
    assert tokenizer.mask_token_id is not None and "abc" in text
