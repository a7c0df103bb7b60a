"""`python -m bench.decode_regen` at tiny size on CPU: both engines, same answers, a JSON report."""

import json

import torch

from bench.decode_common import compare
from bench.decode_regen import main


def test_tiny_run_reports_both_engines_with_identical_answers(tmp_path):
    out = tmp_path / "tiny.json"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        main(["--model", "qwen3_tiny_random", "--prompts", "6", "--max-new-tokens", "6",
              "--batch", "4", "--device", "cpu", "--out", str(out), "--cb-num-blocks", "16"])
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out.read_text())
    # Random weights, no stop token: every answer runs to max_new_tokens on both engines.
    assert result["hf_generate_tokens"] == result["regen_tokens"] == 6 * 6
    assert result["identical_share"] == 1.0 and result["first_mismatches"] == []
    assert result["regen_tokens_per_s"] > 0 and result["hf_generate_tokens_per_s"] > 0
    run = result["cb_runs"][0]
    assert run["options"]["num_blocks"] == 16 and run["resolved"]["num_blocks"] == "16"


def test_compare_names_the_first_differing_position():
    got = compare([[1, 2, 3], [4, 5], [6]], [[1, 2, 3], [4, 9], [6, 7]])
    assert got["identical_share"] == 1 / 3
    assert [(m["prompt"], m["position"], m["reference_len"], m["len"])
            for m in got["first_mismatches"]] == [(1, 1, 2, 2), (2, 1, 1, 2)]
