"""bench.row_kernel at the tiny scale on CPU, the kernel through Triton's interpreter: every
launch setting of the grid runs and answers as the varlen attention does, at both shapes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_every_setting_answers_as_varlen(tmp_path):
    out = tmp_path / "rk.json"
    proc = subprocess.run([sys.executable, "-m", "bench.row_kernel", "--scale", "tiny",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, TRITON_INTERPRET="1"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shapes = json.loads(out.read_text())["shapes"]
    assert set(shapes) == {"qwen3_8b", "smollm2_135m"}
    for shape in shapes.values():
        assert len(shape["settings"]) == 2  # BLOCK_N 16 and 64: one and several blocks a row
        for setting in shape["settings"]:
            assert "error" not in setting and setting["max_diff_vs_varlen"] < 1e-5, setting
        assert shape["default_us"] is not None and shape["best"]["us"] > 0


@pytest.mark.slow
def test_a_default_setting_without_a_figure_ends_nonzero(tmp_path):
    """A grid whose default setting cannot run (here: the kernel's own default left out of
    it) ends rc != 0 naming the shapes, the figures it did make still written."""
    script = ("import sys; from bench import row_kernel as b; "
              "b.TINY_GRID = {'BLOCK_N': (16,), 'NUM_WARPS': (4,), 'NUM_STAGES': (2,)}; "
              "b.main(sys.argv[1:])")
    out = tmp_path / "rk.json"
    proc = subprocess.run([sys.executable, "-c", script, "--scale", "tiny", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, TRITON_INTERPRET="1"), timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "the default setting gave no figure at qwen3_8b, smollm2_135m" in proc.stderr
    assert all(s["settings"] for s in json.loads(out.read_text())["shapes"].values())
