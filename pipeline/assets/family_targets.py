"""Tiny random-weight targets of every supported family, as a user would bring them.

Each is a real transformers model of that family (its own config class, small dims),
``save_pretrained`` with a tokenizer that carries the family's chat format
(pipeline/assets/templates.py): the folder our loading code reads, like a downloaded
checkpoint. Built once per machine under ``<assets cache>/../tiny-families-v1/<model_type>``
(a second or two each) and cached like the demo assets: a lock, a temporary sibling folder,
an atomic rename. ``target.path=builtin:tiny-<model_type>`` names one.

The weights are random: these targets test plumbing (drafter built from the config, taps,
training, cache rollback in the evaluator, export), not acceptance.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Optional

from pipeline.assets.cache import default_assets_dir
from pipeline.assets.cache_entry import file_lock, sweep_leftovers
from pipeline.assets.templates import CHAT_FORMATS, family_tokenizer

VERSION = "tiny-families-v1"
_DONE = "config.json"

# Shared small dims: 6 layers (taps 1..4 fit below the last), 4 heads of 16, 2 KV heads.
_SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=6,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=1024, tie_word_embeddings=False)

# What makes each family itself, at the small size: its rope scaling, sliding windows short
# enough that eval prompts cross them, experts, linear-attention or MLA dims.
_FAMILY_DIMS: dict[str, dict] = {
    "qwen3": {},
    "qwen3_moe": dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                      decoder_sparse_step=1, mlp_only_layers=[0]),
    "llama": dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                   "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 64}),
    "mistral": dict(sliding_window=None),
    "gemma3_text": dict(sliding_window=8, query_pre_attn_scalar=16, tie_word_embeddings=True,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"]
                        * 2),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"] * 3,
                    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0,
                                     "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                     "truncate": False,
                                     "original_max_position_embeddings": 256}),
    "qwen3_5_text": dict(linear_num_key_heads=2, linear_num_value_heads=4,
                         linear_key_head_dim=16, linear_value_head_dim=16,
                         linear_conv_kernel_dim=4,
                         layer_types=["linear_attention", "linear_attention", "full_attention"]
                         * 2),
    # MLA: no plain head_dim (the config derives it from the rotary part); as many key/value
    # heads as query heads (its attention does not group them).
    "deepseek_v3": dict(head_dim=None, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
                        n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
                        first_k_dense_replace=1, n_group=1, topk_group=1,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                         "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                         "beta_fast": 32.0, "beta_slow": 1.0,
                                         "original_max_position_embeddings": 256}),
}
FAMILY_TARGETS = tuple(_FAMILY_DIMS)


def tiny_config(model_type: str, tokenizer):
    """The family's transformers config at the small size, for ``tokenizer``'s vocabulary."""
    from transformers import AutoConfig

    if model_type not in _FAMILY_DIMS:
        raise ValueError(f"no tiny target for model_type={model_type!r}: allowed "
                         f"{list(FAMILY_TARGETS)}")
    dims = {k: v for k, v in {**_SMALL, **_FAMILY_DIMS[model_type]}.items() if v is not None}
    return AutoConfig.for_model(
        model_type, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **dims)


def build_family_target(model_type: str, out_dir: str, base_tokenizer, seed: int = 0) -> str:
    """Write a random-weight ``model_type`` target and its tokenizer into ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = family_tokenizer(base_tokenizer, model_type)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, tokenizer))
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def family_targets_dir() -> str:
    return os.path.join(os.path.dirname(default_assets_dir()), VERSION)


def tiny_base_tokenizer():
    from pipeline.assets.corpus import pydoc_topics
    from pipeline.assets.recipe import TinyRecipe
    from pipeline.assets.tokenizer import build_tokenizer

    return build_tokenizer([text for _, text in pydoc_topics()], TinyRecipe().vocab_size)


def ensure_family_target(model_type: str, root: Optional[str] = None,
                         base_tokenizer=None) -> str:
    """The folder of the tiny ``model_type`` target, built on first use."""
    if model_type not in CHAT_FORMATS or model_type not in _FAMILY_DIMS:
        raise ValueError(f"no tiny target for model_type={model_type!r}: allowed "
                         f"{list(FAMILY_TARGETS)}")
    root = root or family_targets_dir()
    folder = os.path.join(root, model_type)
    sweep_leftovers(folder, folder + ".lock")
    if os.path.isfile(os.path.join(folder, _DONE)):
        return folder
    os.makedirs(root, exist_ok=True)
    with file_lock(folder + ".lock"):
        if not os.path.isfile(os.path.join(folder, _DONE)):
            tmp = tempfile.mkdtemp(prefix=f".{model_type}.building-", dir=root)
            try:
                build_family_target(model_type, tmp, base_tokenizer or tiny_base_tokenizer())
                shutil.rmtree(folder, ignore_errors=True)  # an empty or unfinished one
                os.rename(tmp, folder)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    return folder
