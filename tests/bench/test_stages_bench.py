"""bench/scale/stages.py's wiring on CPU at a small Qwen3 shape (the H200 run is the 8B one)."""

from bench.scale.stages import run_stages
from pipeline.model.config import qwen3_8b_config


def test_run_stages_gives_rates_and_the_whole_targets_taps(ray_cluster, tmp_path):
    small = dict(qwen3_8b_config(), hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=4096,
                 bos_token_id=None, eos_token_id=None)
    out = run_stages(tmp_path, rows=2, length=48, micro_batches=8, warmup=2, device="cpu",
                     config=small, taps=(1, 3, 4))
    assert out["whole_target_samples_per_s"] > 0 and out["staged_target_samples_per_s"] > 0
    assert out["taps_shape"] == [2, 48, 3 * 64] and out["taps_abs_max"] > 0
    assert out["staged_taps_max_abs_diff"] <= 1e-2 * out["taps_abs_max"]
