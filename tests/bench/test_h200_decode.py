"""bench.h200_decode at the tiny scale on CPU: the GGUF goes through the pipeline's conversion,
each run in its own process, and the gathered figures say what the runs measured (fp32: the
static engine answers as generate does, the two evaluators give the same tau and outputs)."""

import json

from bench import h200_decode


def test_tiny_scale_gathers_each_runs_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_GGUF_CACHE", str(tmp_path / "gguf"))
    out = tmp_path / "decode.json"
    result = h200_decode.main(["--scale", "tiny", "--only", "smol_static,cpu_eval_equal",
                               "--out", str(out), "--logs", str(tmp_path / "logs")])
    assert json.loads(out.read_text()) == result
    assert set(result["runs"]) == {"smol_static", "cpu_eval_equal"}
    smol = result["smollm2_135m"]
    assert smol["regen_tokens_per_s"] > 0 and smol["hf_generate_tokens_per_s"] > 0
    assert smol["regen_identical_to_hf_share"] == 1.0
    assert smol["cb_tokens_per_s"] is None  # not run: no figure is made up for it
    assert result["eval_tau_equal"] is True
