"""The decode bench end to end on CPU at tiny size: every run decodes, and in fp32 the static
engine's answers equal HF generate's (the bench's own comparison says so)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from bench import decode_static
from bench.decode_common import random_8b_fields


def test_bench_runs_and_matches_generate(tmp_path):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "model")
    out = tmp_path / "r.json"
    result = decode_static.main(["--model", str(tmp_path / "model"), "--prompts", "6",
                                 "--max-new-tokens", "5", "--batch", "4", "--device", "cpu",
                                 "--dtype", "fp32", "--random-prompts", "2:9",
                                 "--runs", "static,hf", "--prefill-tokens", "16",
                                 "--out", str(out)])  # prefill groups of 1-2 prompts
    assert json.loads(out.read_text()) == result
    runs = result["runs"]
    assert runs["static"]["generated_tokens"] == runs["hf"]["generated_tokens"] == 6 * 5
    assert runs["static"]["identical_share"] == 1.0 and runs["static"]["first_mismatches"] == []
    assert result["prompt_tokens"]["min"] >= 2 and result["prompt_tokens"]["max"] <= 9


def test_a_failing_step_variant_is_reported_and_the_others_stand(tmp_path):
    from bench.decode_step import step_timing

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    out = step_timing(model, prompts, rows=2, attentions=("sdpa", "no-such-kernel", "flex"),
                      steps=2)
    variants = out["variants"]
    assert variants["no-such-kernel"]["error"].startswith("KeyError")
    prefill = out["prefill"]["head-major"]  # sdpa and flex share a cache layout
    assert list(out["prefill"]) == ["head-major"]
    assert list(prefill) == ["16384_tokens", "65536_tokens"]
    for call in prefill.values():  # both prompts fit either budget
        assert call["prompts"] == 2 and call["tokens"] == 8 and call["ms"] > 0
    for name in ("sdpa", "flex"):
        assert "error" not in variants[name] and variants[name]["uncaptured_ms"] > 0


def test_the_prefill_is_timed_compiled_when_asked(monkeypatch):
    """--compile-prefill reaches the step timing's decoders: their prefills (timed and
    profiled) go through the compiled forward, one per cache layout; without it, none do."""
    from bench.decode_step import step_timing
    from pipeline.regen import static_decoder

    compiled = []

    def recording(body):  # stands in for torch.compile: the calls are what is checked
        compiled.append(body)
        return body

    monkeypatch.setattr(static_decoder, "compiled_prefill", recording)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    out = step_timing(model, prompts, rows=2, attentions=("sdpa",), steps=2)
    assert compiled == [] and "error" not in out["variants"]["sdpa"]
    out = step_timing(model, prompts, rows=2, attentions=("sdpa", "varlen"), steps=2,
                      compile_prefill=True)
    assert compiled == [model.base_model] * 2  # head-major and token-major
    assert sorted(out["prefill"]) == ["head-major", "token-major"]


def test_the_variants_without_a_figure_are_named_for_the_commands_exit():
    ok = {"uncaptured_ms": 1.0}
    result = {"step": {"512": {"variants": {"varlen": ok, "triton": {"error": "E: x"}}},
                       "64": {"variants": {"varlen": ok}}}}
    assert decode_static.failed_variants(result) == ["512:triton"]
    assert decode_static.failed_variants({"runs": {}}) == []


def test_split_of_a_call_decoded_wholly_apart():
    """Every prompt too long for the kept cache (the 8B shape at 512 rows on an 80 GB card):
    the engine's stats hold only the apart part, and the bench splits that one."""
    from pipeline.regen.cache_budget import slot_bytes
    from pipeline.regen.static_engine import StaticEngine

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    per_slot = slot_bytes(model.config, torch.float32)
    engine = StaticEngine(model, 2, cuda_graphs=False, cache_gb=2 * 16 * per_slot / 1e9)
    with torch.no_grad():
        answers = engine.decode([[1] * 20, [2] * 30, [3] * 25], 4, set())
    assert set(engine.last_stats) == {"long"}  # nothing fit the 16 columns kept
    tokens = sum(map(len, answers))
    split = decode_static.split(engine.last_stats, tokens)
    assert split["all_decoded_apart"] is True and split["prompts"] == 3
    assert split["steps"] == engine.last_stats["long"]["steps"] > 0
    assert 0 < split["decode_s"] <= split["wall_s"]


def test_layers_cut_the_8b_shape_and_nothing_else(capsys):
    """``--layers``: the 8B config with fewer decoder layers, every other field the same; refused
    for another model or a count under 1, naming the flag."""
    from transformers import Qwen3Config

    whole, cut = random_8b_fields(), random_8b_fields(2)
    assert whole["num_hidden_layers"] == 36 and cut["num_hidden_layers"] == 2
    assert {k: v for k, v in cut.items() if k != "num_hidden_layers"} == \
        {k: v for k, v in whole.items() if k != "num_hidden_layers"}
    config = Qwen3Config(**cut)
    assert config.num_hidden_layers == 2 and config.hidden_size == 4096
    for argv in (["--model", "some/folder", "--layers", "2"],
                 ["--model", "qwen3_8b_random", "--layers", "0"]):
        with pytest.raises(SystemExit):
            decode_static.main([*argv, "--runs="])
        assert f"--layers {argv[-1]}: a count of 1 or more, with --model qwen3_8b_random only" \
            in capsys.readouterr().err
