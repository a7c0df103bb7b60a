import pytest
from omegaconf import OmegaConf

from pipeline.data import DataConfig


def test_defaults_are_valid_and_omegaconf_can_type_them():
    cfg = OmegaConf.structured(DataConfig)
    assert cfg.format == "auto" and cfg.max_length == 512
    assert OmegaConf.to_object(cfg) == DataConfig()


@pytest.mark.parametrize("key, value, allowed", [
    ("format", "jsonl", "['auto', 'messages', 'sharegpt']"),
    ("on_bad_line", "ignore", "['error', 'skip']"),
    ("max_length", 1, ">= 2"),
    ("max_length", True, ">= 2"),
    ("micro_batch_size", 0, ">= 1"),
    ("seed", -1, ">= 0"),
    ("train_path", "", "builtin:tiny"),
])
def test_bad_values_name_key_value_and_allowed(key, value, allowed):
    with pytest.raises(ValueError) as e:
        DataConfig(**{key: value})
    message = str(e.value)
    assert f"data.{key}={value!r}" in message and allowed in message
