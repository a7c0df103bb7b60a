"""bench/checkpoint_stall.py on a narrow drafter (CPU): every figure it prints is measured."""

from bench.checkpoint_stall import measure


def test_small_run_gives_save_and_restart_load_figures(tmp_path):
    out = measure(tmp_path, layers=1, saves=2, device="cpu", small=True, threads=(1, 2))
    assert out["device"] == "cpu" and out["params"] > 0
    assert [r["threads"] for r in out["saves"]] == [1, 1, 2, 2]
    assert all(r["bytes"] > 4 * 3 * out["params"] for r in out["saves"])  # fp32 x3, + index
    assert out["load_s"] > 0 and out["fresh_load_s"] > 0 and out["load_after_read_ahead_s"] > 0
    for way in ("from_files", "read_ahead"):
        run = out["restart"][way]
        parts = run["built_s"] + (run["waited_s"] or 0.0) + run["load_s"]
        assert 0 < parts <= run["total_s"], way
    assert out["restart"]["from_files"]["waited_s"] is None  # nothing read ahead to wait for
    assert out["restart"]["read_ahead"]["waited_s"] >= 0
    assert not any(tmp_path.iterdir())  # the saves are removed
