"""The model-family seam: what the drafter takes from each kind of target, in one table.

A DFlash drafter is the same module for every target: Qwen3-style decoder layers (RMSNorm,
per-head q/k norms, RoPE over the whole head, SwiGLU), because that is what SGLang, vLLM and
z-lab's code build from the exported ``config.json`` whatever the target is (dflash.md).
What must follow the target is what the drafter shares with it or reads from it:

- the residual width (``hidden_size``), the vocabulary, the norm epsilon;
- the embedding it embeds blocks with, *as the target applies it* (Gemma multiplies by
  sqrt(hidden)) and the LM head (tied or not);
- the RoPE its attention uses: the target's theta and scaling (llama3, yarn...). A target
  with several ropes (Gemma 3: local and global) gives its global one, since every drafter
  layer is full attention; a partial rotary (Qwen3.5) becomes a full one, which is what
  Qwen3 layers in servers apply;
- where the taps come from (the outputs of ``model.layers[i]``, whatever the layer is: full,
  sliding, linear-attention, MoE or MLA);
- how speculative decoding in the evaluator takes back rejected tokens from the target's
  cache: ``crop`` (drop the tail of every layer's keys/values) where each layer's cache is a
  plain key/value list, else ``recompute`` (the target re-reads the accepted text without a
  cache each round: slower, always right) where the cache holds state that cannot be cut
  back (a linear-attention layer's recurrent state);
- whether the evaluator may decode many prompts at once (pipeline/eval/batched.py: shared
  cache columns with per-row holes, which needs a cache of plain key/value columns); a family
  without it is decoded prompt by prompt.

Targets of any other ``model_type`` are refused before anything starts, naming the
architecture and this list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from pipeline.serving.layout import SERVED_ROPE_TYPES as ROPE_TYPES

ROLLBACKS = ("crop", "recompute")
# Rope fields those types read; anything else (mrope sections, partial rotary) is the
# target's business, not the drafter's.
_ROPE_KEYS = ("rope_type", "rope_theta", "factor", "original_max_position_embeddings",
              "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "mscale",
              "mscale_all_dim", "attention_factor", "truncate")


class UnsupportedTarget(ValueError):
    """The target's family is not one the drafter can be built for; one line."""


def _plain_heads(cfg: Mapping) -> tuple[int, int, int]:
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    return heads, kv, head_dim


def _mla_heads(cfg: Mapping) -> tuple[int, int, int]:
    """MLA (DeepSeek-V3) has no plain head shape: its config's ``head_dim`` is the 64-wide
    rotary part only. The drafter's heads are as wide as the target's value heads, as many
    as fill the hidden size (DeepSeek-V3: 56 x 128), with up to 8 key/value heads."""
    head_dim = int(cfg.get("v_head_dim") or cfg["qk_nope_head_dim"])
    heads = max(1, int(cfg["hidden_size"]) // head_dim)
    kv = max(k for k in range(1, min(8, heads) + 1) if heads % k == 0)
    return heads, kv, head_dim


def _no_scale(cfg: Mapping) -> float:
    return 1.0


def _sqrt_hidden(cfg: Mapping) -> float:
    return float(cfg["hidden_size"]) ** 0.5


@dataclass(frozen=True)
class Family:
    model_type: str   # HF config.json model_type
    name: str         # as users know it
    # crop or recompute: how the evaluator takes rejected tokens back out of the target's cache
    rollback: str
    # The target's layer kinds the taps go through (said in messages and the README).
    layers: str
    heads: Callable[[Mapping], tuple[int, int, int]] = _plain_heads
    # The factor the target's embedding module multiplies looked-up rows by.
    embed_scale: Callable[[Mapping], float] = _no_scale
    # When rope_parameters is keyed by layer type: the entry the drafter uses.
    rope_of_layer_type: Optional[str] = None
    # Whether the evaluator's many-prompts path serves it (pipeline/eval/batched.py), and
    # whether its verify step can be captured as a CUDA graph there (MoE routing in
    # transformers counts tokens per expert on the host: no capture).
    batched_decode: bool = True
    graph_verify: bool = True

    def __post_init__(self) -> None:
        assert self.rollback in ROLLBACKS, self.rollback
        # Holes in shared columns need a cache that is nothing but key/value columns.
        assert not (self.batched_decode and self.rollback != "crop"), self.model_type


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("qwen3", "Qwen3", "crop", "full attention"),
    Family("qwen3_moe", "Qwen3-MoE", "crop", "full attention, MoE", graph_verify=False),
    Family("llama", "Llama 3.x", "crop", "full attention (llama3 rope scaling)"),
    Family("mistral", "Mistral", "crop", "full or sliding attention"),
    Family("gemma3_text", "Gemma 3 (text)", "crop",
           "sliding (local rope) and full (global rope) attention, scaled embedding",
           embed_scale=_sqrt_hidden, rope_of_layer_type="full_attention"),
    Family("gpt_oss", "gpt-oss", "crop", "sliding and full attention with sinks, MoE",
           graph_verify=False),
    Family("qwen3_5_text", "Qwen3.5 (text)", "recompute",
           "hybrid: linear attention (gated delta net) and full attention",
           batched_decode=False, graph_verify=False),
    Family("deepseek_v3", "DeepSeek-V3", "crop", "MLA, MoE", heads=_mla_heads,
           graph_verify=False),
)}

# Multimodal wrappers of supported text families: their text tower is supported, but only
# from a text-only checkpoint (the wrapper's weights and config nest the text model).
_WRAPPERS = {"gemma3": "gemma3_text", "qwen3_5": "qwen3_5_text"}


def supported() -> str:
    return ", ".join(f"{f.model_type} ({f.name})" for f in FAMILIES.values())


def family_of(target_config: Mapping) -> Family:
    """The target's family, or :class:`UnsupportedTarget` naming its architecture."""
    model_type = target_config.get("model_type")
    family = FAMILIES.get(model_type)
    if family is not None:
        return family
    arch = ", ".join(target_config.get("architectures") or []) or "unknown architecture"
    hint = ""
    if model_type in _WRAPPERS:
        hint = (f" (a multimodal wrapper: use a text-only checkpoint of model_type "
                f"{_WRAPPERS[model_type]!r})")
    raise UnsupportedTarget(f"the target is {arch} (model_type={model_type!r}){hint}, which "
                            f"DFlash drafters cannot be built for here; supported: {supported()}")


def rope_parameters(target_config: Mapping, family: Family) -> dict:
    """The rope the drafter's attention applies: the target's theta and scaling."""
    params = target_config.get("rope_parameters")
    if params and family.rope_of_layer_type and family.rope_of_layer_type in params:
        params = params[family.rope_of_layer_type]
    if not params:  # a transformers 4 style config: flat rope_theta, optional rope_scaling
        params = dict(target_config.get("rope_scaling") or {},
                      rope_theta=target_config.get("rope_theta", 10000.0))
    params = dict(params)
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    rope = {k: params[k] for k in _ROPE_KEYS if params.get(k) is not None}
    rope.setdefault("rope_type", "default")
    rope.setdefault("rope_theta", float(target_config.get("rope_theta") or 10000.0))
    if rope["rope_type"] not in ROPE_TYPES:
        raise UnsupportedTarget(f"the target's rope_type={rope['rope_type']!r} has no Qwen3 "
                                f"drafter equivalent; supported rope types: {list(ROPE_TYPES)}")
    return rope


def drafter_fields(target_config: Mapping) -> dict[str, Any]:
    """The drafter's Qwen3 config fields that come from the target's ``config.to_dict()``."""
    family = family_of(target_config)
    if target_config.get("final_logit_softcapping"):
        raise UnsupportedTarget(
            f"the target ({family.name}) caps its logits (final_logit_softcapping="
            f"{target_config['final_logit_softcapping']}), which the drafter's loss and "
            "drafting do not apply; supported: targets without logit softcapping")
    heads, kv_heads, head_dim = family.heads(target_config)
    hidden = int(target_config["hidden_size"])
    rope = rope_parameters(target_config, family)
    fields = {
        "vocab_size": int(target_config["vocab_size"]), "hidden_size": hidden,
        # MoE targets: their dense width (DeepSeek's first layers, Qwen3-MoE's
        # intermediate_size) or, failing that, an expert's; the drafter is dense.
        "intermediate_size": int(target_config.get("intermediate_size") or 3 * hidden),
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(target_config.get("max_position_embeddings") or 4096),
        "rms_norm_eps": float(target_config.get("rms_norm_eps") or 1e-6),
        "rope_parameters": rope, "rope_theta": rope["rope_theta"],
        "attention_bias": bool(target_config.get("attention_bias", False)),
        "attention_dropout": 0.0,
        "initializer_range": float(target_config.get("initializer_range") or 0.02),
    }
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if target_config.get(key) is not None:
            fields[key] = target_config[key]
    return fields


def embed_scale(target_config: Mapping) -> float:
    return family_of(target_config).embed_scale(target_config)


def rollback_of(model_type: Optional[str]) -> str:
    """How the evaluator rolls the target's cache back; targets of no family recompute."""
    family = FAMILIES.get(model_type or "")
    return family.rollback if family else "recompute"


def batched_of(model_type: Optional[str]) -> Optional[str]:
    """None when the evaluator may decode many prompts of this target at once, else why not."""
    family = FAMILIES.get(model_type or "")
    if family is None:
        return f"model_type={model_type!r} is no known family"
    if not family.batched_decode:
        return (f"{family.name} keeps state that cannot be cut back to a prefix "
                f"({family.layers}), so it has no many-prompts path")
    return None


def graph_verify_of(model_type: Optional[str]) -> Optional[str]:
    """None when the batched evaluator may capture this target's verify step as a CUDA graph,
    else why not."""
    family = FAMILIES.get(model_type or "")
    if family is None or not family.graph_verify:
        name = family.name if family else repr(model_type)
        return f"{name}'s layers ({family.layers if family else 'unknown'}) sync with the host"
    return None
