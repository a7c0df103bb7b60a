"""The smollm2_135m preset: a block-16 drafter for SmolLM2-135M-Instruct's 30 layers, its mask
token an existing special token (SmolLM2 has none), and the recipe it documents."""

from pipeline.driver.compose import compose_job
from pipeline.model.config import build_drafter_spec, resolve_tap_ids

# SmolLM2-135M-Instruct's published config (the fields the drafter derives from).
SMOLLM2 = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 576,
           "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
           "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "max_position_embeddings": 8192,
           "rope_theta": 100000.0, "hidden_act": "silu", "attention_bias": False}


def test_preset_composes_the_recipe():
    job = compose_job(config_name="smollm2_135m")
    d = job.drafter
    assert d.block_size == 16 and d.num_layers == 5 and d.init == "random"
    assert d.mask_token_id == 16 and d.resolved_gamma() == 1.0 and d.num_anchors == 256
    assert job.target.path.endswith(".gguf") and not job.target.compile
    assert job.data.batching == "pack" and job.data.anchors_per_micro_batch == 8192
    assert job.data.tokens_per_micro_batch == 24576 and job.train.plan.epochs == 2
    assert job.train.optim.lr == 1.5e-3
    assert job.cluster.drafters_per_node == 1  # one_gpu: target and drafter share it


def test_preset_taps_fit_30_layers_and_the_drafter_takes_the_target_width():
    job = compose_job(config_name="smollm2_135m")
    taps = resolve_tap_ids(job.drafter, 30)
    assert taps == [1, 8, 14, 20, 27] and max(taps) < 29  # never the last layer
    spec = build_drafter_spec(SMOLLM2, job.drafter, tokenizer_mask_id=None)
    assert spec.hidden_size == 576 and spec.mask_token_id == 16
    assert spec.hf_config["num_attention_heads"] == 9
    assert spec.hf_config["num_key_value_heads"] == 3
    assert spec.hf_config["vocab_size"] == 49152 and spec.block_size == 16
