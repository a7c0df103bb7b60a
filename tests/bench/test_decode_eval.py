"""bench.decode_eval on CPU at tiny size: both evaluators run on the same prompts and drafter
(an export folder, read back), and in fp32 they agree exactly."""

import json

import torch
from transformers import AutoConfig

from bench import decode_eval
from pipeline.model.config import DrafterConfig, build_drafter_spec
from pipeline.model.drafter import DFlashDrafter
from pipeline.model.serving_format import save_drafter


def test_decode_eval_reports_both_paths_and_they_agree(family_target, tmp_path):
    path = family_target("llama")
    spec = build_drafter_spec(AutoConfig.from_pretrained(path).to_dict(),
                              DrafterConfig(num_layers=1, block_size=4, num_taps=2),
                              tokenizer_mask_id=3)
    torch.manual_seed(3)
    export = save_drafter(DFlashDrafter(spec), tmp_path / "export", "float32")
    out = tmp_path / "result.json"
    result = decode_eval.main(["--target", str(path), "--drafter", str(export), "--prompts", "3",
                               "--prompt-len", "10", "--max-new-tokens", "6", "--device", "cpu",
                               "--batch-size", "2", "--baseline-prompts", "2",
                               "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["baseline"]["prompts"] == 2 and result["batched"]["prompts"] == 3
    assert result["batch_size"] == 2 and result["graphs"] is False
    assert result["block_size"] == 4 and result["dtype"] == "float32"
    assert result["outputs_agree_share"] == 1.0 and result["tau_difference"] == 0.0
    assert result["batched"]["tau_on_baseline_prompts"] == result["baseline"]["tau"]
    for side in ("baseline", "batched"):
        assert result[side]["eval_seconds"] > 0 and result[side]["tau"] >= 1.0


def test_graphs_on_without_cuda_is_refused(capsys):
    import pytest

    with pytest.raises(SystemExit):
        decode_eval.main(["--target", "builtin:tiny-qwen3", "--device", "cpu", "--graphs", "on"])
    assert "--graphs on needs --device cuda, not cpu" in capsys.readouterr().err
