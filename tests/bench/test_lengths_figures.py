"""bench.lengths' figures from its runs' rates, including runs that measured nothing."""

import json
import math

import pytest

from bench import lengths


def test_figures_follow_from_the_rates():
    runs = {"full_rows": {"samples_per_s": 4.0}, "padded": {"samples_per_s": 5.0},
            "bucket": {"samples_per_s": 15.0}}
    out = lengths.figures(runs, mean_len=500.0, full_len=3000.0, mean_anchors=256.0,
                          full_anchors=512.0)
    assert out["ideal_samples_per_s"] == 4.0 * 3000.0 / 500.0
    assert out["efficiency"] == 15.0 / 24.0 and out["speedup"] == 3.0
    assert out["anchor_ideal_samples_per_s"] == 8.0 and out["anchor_efficiency"] == 15.0 / 8.0
    assert out["tokens_per_s"] == 15.0 * 500.0 and out["missing"] == ["pack"]
    assert out["method"] == "bucket" and out["predicted_node8_samples_per_s"] > 0
    # A pack run, once measured, is the packed rate.
    runs["pack"] = {"samples_per_s": 20.0}
    out = lengths.figures(runs, mean_len=500.0, full_len=3000.0)
    assert (out["method"], out["packed_samples_per_s"], out["speedup"]) == ("pack", 20.0, 4.0)
    assert out["bucket_samples_per_s"] == 15.0 and out["anchor_efficiency"] is None


def test_a_run_without_a_rate_leaves_its_figures_null_not_nan():
    runs = {"full_rows": {"samples_per_s": 4.8},
            "padded": {"error": "over --run-timeout 165 s"},
            "bucket": {"error": "over --run-timeout 165 s"}}
    out = lengths.figures(runs, mean_len=500.0, full_len=3000.0)
    assert out["missing"] == ["padded", "bucket", "pack"]
    assert out["ideal_samples_per_s"] == pytest.approx(28.8)
    for key in ("packed_samples_per_s", "efficiency", "speedup",
                "predicted_node8_samples_per_s"):
        assert out[key] is None, key
    text = json.dumps(out, allow_nan=False)  # strict JSON: no NaN anywhere
    assert not any(isinstance(v, float) and math.isnan(v) for v in json.loads(text).values())


def test_unknown_run_names_are_refused_naming_the_allowed_ones(capsys):
    with pytest.raises(SystemExit):
        lengths.main(["--runs", "full_rows,packed"])
    assert "full_rows,padded,bucket,pack" in capsys.readouterr().err


def test_the_plot_shows_only_the_rates_measured():
    from bench.plot_lengths import bars

    got = bars({"padded_samples_per_s": 5.0, "bucket_samples_per_s": None,
                "pack_samples_per_s": 8.8, "ideal_samples_per_s": 26.8})
    assert [(label, rate) for label, rate, _ in got] == [("padded", 5.0), ("pack", 8.8),
                                                         ("token ideal", 26.8)]
