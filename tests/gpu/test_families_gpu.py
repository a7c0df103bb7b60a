"""Every supported family at its published widths on the GPU (CPU version, tiny:
tests/model/test_families.py).

Each target keeps its real hidden size, heads, head_dim, vocabulary, rope and expert shape,
cut to 4 layers (and DeepSeek-V3 to 8 of its 256 experts) so that random weights fit and
build fast. Per family: the drafter derived from the config trains a step under bf16
autocast with flex attention; speculative decoding with an oracle proposer is lossless
through the family's cache rollback; the export loads strictly with AutoModel.
With DFLASH_GPU_TESTS_ON_CPU=1 the widths are divided by 8 (same code path, CPU-sized)."""

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from pipeline.eval.speculative import acceptance_length, speculative_generate
from pipeline.model.config import DrafterConfig, build_drafter_spec
from pipeline.model.drafter import DFlashDrafter, embed_tokens
from pipeline.model.serving_format import save_drafter
from pipeline.model.target import TargetHead, TargetFeatures
from pipeline.objective.step import Objective, drafter_loss

LAYERS = 4
# Published widths (config.json of each checkpoint named), depth cut to LAYERS.
REAL = {
    "qwen3": ("Qwen3-8B", dict(hidden_size=4096, intermediate_size=12288,
                                num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                vocab_size=151936, rope_theta=1e6)),
    "qwen3_moe": ("Qwen3-30B-A3B", dict(hidden_size=2048, intermediate_size=6144,
                                         moe_intermediate_size=768, num_experts=128,
                                         num_experts_per_tok=8, num_attention_heads=32,
                                         num_key_value_heads=4, head_dim=128,
                                         vocab_size=151936, rope_theta=1e6)),
    "llama": ("Llama-3.1-8B", dict(hidden_size=4096, intermediate_size=14336,
                                    num_attention_heads=32, num_key_value_heads=8,
                                    vocab_size=128256, rms_norm_eps=1e-5,
                                    rope_parameters={"rope_type": "llama3", "rope_theta": 5e5,
                                                     "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 8192})),
    "mistral": ("Mistral-7B-v0.3", dict(hidden_size=4096, intermediate_size=14336,
                                         num_attention_heads=32, num_key_value_heads=8,
                                         vocab_size=32768, rope_theta=1e6, sliding_window=None)),
    "gemma3_text": ("gemma-3-1b", dict(hidden_size=1152, intermediate_size=6912,
                                        num_attention_heads=4, num_key_value_heads=1,
                                        head_dim=256, vocab_size=262144, sliding_window=512,
                                        query_pre_attn_scalar=256,
                                        layer_types=["sliding_attention"] * 3
                                        + ["full_attention"])),
    "gpt_oss": ("gpt-oss-20b", dict(hidden_size=2880, intermediate_size=2880,
                                     num_local_experts=32, num_experts_per_tok=4,
                                     num_attention_heads=64, num_key_value_heads=8,
                                     head_dim=64, vocab_size=201088, sliding_window=128,
                                     layer_types=["sliding_attention", "full_attention"] * 2)),
    "qwen3_5_text": ("Qwen3.5 (transformers' defaults)",
                     dict(layer_types=["linear_attention"] * 3 + ["full_attention"])),
    "deepseek_v3": ("DeepSeek-V3", dict(n_routed_experts=8, first_k_dense_replace=1,
                                         n_group=1, topk_group=1,
                                         rope_parameters={"rope_type": "yarn",
                                                          "rope_theta": 1e4, "factor": 40.0,
                                                          "mscale": 1.0, "mscale_all_dim": 1.0,
                                                          "beta_fast": 32.0, "beta_slow": 1.0,
                                                          "original_max_position_embeddings":
                                                          4096})),
}
_WIDTHS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "vocab_size",
           "q_lora_rank", "kv_lora_rank")


def real_config(model_type, shrink):
    config = AutoConfig.for_model(model_type, num_hidden_layers=LAYERS,
                                  max_position_embeddings=4096, **REAL[model_type][1])
    config.num_hidden_layers = LAYERS
    if shrink > 1:  # CPU check of the same logic: narrower, same shape of everything else
        for key in _WIDTHS:
            if getattr(config, key, None):
                setattr(config, key, getattr(config, key) // shrink)
    return config


@pytest.fixture(scope="module")
def dtype_and_shrink(device):
    return (torch.bfloat16, 1) if device == "cuda" else (torch.float32, 8)


@pytest.mark.parametrize("model_type", list(REAL))
def test_family_at_real_widths(model_type, device, dtype_and_shrink, tmp_path):
    dtype, shrink = dtype_and_shrink
    config = real_config(model_type, shrink)
    torch.manual_seed(0)
    with torch.device(device):
        target = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    options = DrafterConfig(num_layers=1, block_size=8, num_taps=2, mask_token_id=5,
                            num_anchors=16, attention="flex" if device == "cuda" else "sdpa")
    spec = build_drafter_spec(config.to_dict(), options)
    assert spec.hidden_size == config.hidden_size
    head = TargetHead(target.get_input_embeddings().weight.detach(),
                      target.get_output_embeddings().weight.detach(),
                      embed_scale=float(getattr(target.get_input_embeddings(), "embed_scale",
                                                1.0)))

    # One training step of the drafter on the target's tap features, bf16 autocast on CUDA.
    cut = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device).eval()
    cut.load_state_dict(target.state_dict())
    del cut.model.layers[max(spec.target_layer_ids) + 1:]
    features = TargetFeatures(cut, spec.target_layer_ids)
    drafter = DFlashDrafter(spec).to(device)
    ids = torch.randint(10, config.vocab_size, (2, 256), device=device)
    mask = torch.ones_like(ids)
    objective = Objective.from_config(spec, options)
    anchors = objective.anchors(mask, [0, 1], seed=0, epoch=0)
    with torch.autocast(device, dtype=dtype, enabled=device == "cuda"):
        parts = drafter_loss(drafter, head.to(device), objective, features(ids), ids, mask,
                             anchors, compute_dtype=dtype)
    loss = parts.numerator / parts.denominator
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in drafter.parameters())

    # Lossless speculative decoding through the family's rollback (fp32 target).
    prompt = torch.randint(10, config.vocab_size, (300,)).tolist()  # past the sliding windows
    seq = torch.tensor(prompt, device=device)[None]
    with torch.no_grad():
        for _ in range(20):
            seq = torch.cat([seq, target(seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    greedy = seq[0, len(prompt):].tolist()

    class Oracle:
        block_size = spec.block_size

        def propose(self, tokens, feats):
            n = tokens.numel() - len(prompt)
            return torch.tensor(greedy[n:n + self.block_size - 1], device=device)
    result = speculative_generate(target, Oracle(), prompt, spec.target_layer_ids, 12)
    assert result.tokens[:12] == greedy[:12] and acceptance_length([result]) == spec.block_size

    out = save_drafter(drafter, tmp_path / "export", "float32")
    loaded, info = AutoModel.from_pretrained(out, trust_remote_code=True, dtype=torch.float32,
                                             output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    # The loaded drafter drafts what ours drafts (anchor: the prompt's last token at a).
    a = len(prompt) - 1
    block = torch.full((1, spec.block_size), spec.mask_token_id, device=device)
    block[0, 0] = prompt[-1]
    with torch.no_grad():
        ctx = features(torch.tensor(prompt, device=device)[None])[:, :a]
        embeds = embed_tokens(head.embed, block, scale=head.embed_scale)
        pos = torch.arange(a + spec.block_size, device=device)[None]
        theirs = loaded.to(device)(position_ids=pos, target_hidden=ctx, noise_embedding=embeds)
        ours = drafter(ctx, embeds, pos[:, :a], pos[:, a:], None)
    torch.testing.assert_close(theirs, ours, rtol=1e-3, atol=1e-3)
