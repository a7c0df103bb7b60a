"""The ``triton`` decode attention's kernel (pipeline/regen/row_kernel.py) on CPU, through
Triton's interpreter: its output against fp32 attention row by row, the slots past each row's
length and the other rows' caches checked by perturbation, and the static engine on that step
against generate (tests/regen/interpreted_row_kernel.py, in a process of its own). The GPU
tier runs the compiled kernel in bf16 (tests/gpu/test_static_decoder_gpu.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_kernel_and_engine_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "tests.regen.interpreted_row_kernel"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(found["kernel"]) == 3
    for case in found["kernel"]:
        assert case["max_error"] < 1e-5, case
        assert case["past_length_ignored"] and case["rows_apart_equal"], case
    assert found["engine_equals_generate"] == {"qwen3": True, "llama": True}
    calls = found["decode_calls"]
    assert calls > 0 and found["decode_calls_to_the_kernel"] == calls
