"""Tap ids the servers can capture: never the target's last layer."""

import pytest

from pipeline.model.config import (DrafterConfig, build_drafter_spec, default_tap_ids,
                                   qwen3_8b_config)


def test_last_layer_tap_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"drafter.target_layer_ids=\[1, 17, 35\] taps the "
                                         r"target's last layer \(35\).*sglang issue 32204.*"
                                         r"before or after the final norm; allowed 0..34"):
        build_drafter_spec(qwen3_8b_config(), DrafterConfig(target_layer_ids=[1, 17, 35]), 151669)


def test_second_to_last_layer_is_allowed():
    spec = build_drafter_spec(qwen3_8b_config(), DrafterConfig(target_layer_ids=[1, 34]), 151669)
    assert spec.target_layer_ids == (1, 34)


@pytest.mark.parametrize("layers", [4, 8, 36, 64])
@pytest.mark.parametrize("taps", [2, 3, 5, 8])
def test_default_taps_stop_short_of_the_last_layer(layers, taps):
    assert max(default_tap_ids(layers, taps)) == layers - 3
