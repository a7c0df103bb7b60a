"""bench.fused_proj_probe on CPU at a tiny shape: every rows setting timed both ways."""

import pytest

from bench.fused_proj_probe import main


def test_probe_times_both_layouts_at_each_rows_setting(tmp_path):
    out = tmp_path / "probe.json"
    result = main(["--device", "cpu", "--dtype", "fp32", "--layers", "2", "--rows", "3,5",
                   "--hidden", "32", "--heads", "4", "--kv-heads", "2", "--intermediate", "48",
                   "--iters", "1", "--out", str(out)])
    assert set(result["rows"]) == {3, 5}
    for figures in result["rows"].values():
        for name in ("qkv", "gate_up"):
            part = figures[name]
            assert part["apart_us"] > 0 and part["fused_us"] > 0
            assert part["saved_us"] == pytest.approx(part["apart_us"] - part["fused_us"], abs=0.02)
            assert 0.0 <= part["equal_share"] <= 1.0
    assert out.read_text().startswith("{")
