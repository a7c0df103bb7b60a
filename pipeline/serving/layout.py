"""The exact tensors and config fields DFlash loaders expect, checked before an export ships.

SGLang and vLLM build the drafter from config.json, then copy in each checkpoint tensor whose
name they know; they skip unknown names and never report a module left unfilled. A renamed
tensor would therefore serve random weights without a word. The expected set here is derived
from config.json alone, the way those loaders derive it, and anything missing, extra or
misshapen stops the export.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence, Union

MODELING_FILE = Path(__file__).with_name("modeling_dflash.py")
# config.json's pointer to the modeling file copied beside the weights.
AUTO_MAP = {"AutoModel": f"{MODELING_FILE.stem}.DFlashDraftModel"}
_SHOW = 5  # names listed per kind of mismatch
# Rope types the Qwen3 layers of SGLang, vLLM and transformers all build for a drafter; a
# target's other ropes are refused before training (pipeline/model/families.py).
SERVED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


class ExportError(ValueError):
    """An export that loaders would read wrongly; the message lists what differs."""


def expected_tensors(config: Mapping) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a loader fills, from a drafter config.json."""
    h, inner = int(config["hidden_size"]), int(config["intermediate_size"])
    heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    head_dim = int(config.get("head_dim") or h // heads)
    taps = len(config["dflash_config"]["target_layer_ids"])
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    shapes = {"fc.weight": (h, taps * h), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    for i in range(int(config["num_hidden_layers"])):
        p = f"layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (q_out, h), p + "self_attn.k_proj.weight": (kv_out, h),
            p + "self_attn.v_proj.weight": (kv_out, h), p + "self_attn.o_proj.weight": (h, q_out),
            p + "self_attn.q_norm.weight": (head_dim,), p + "self_attn.k_norm.weight": (head_dim,),
            p + "mlp.gate_proj.weight": (inner, h), p + "mlp.up_proj.weight": (inner, h),
            p + "mlp.down_proj.weight": (h, inner),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        })
        if config.get("attention_bias"):
            shapes.update({p + "self_attn.q_proj.bias": (q_out,),
                           p + "self_attn.k_proj.bias": (kv_out,),
                           p + "self_attn.v_proj.bias": (kv_out,),
                           p + "self_attn.o_proj.bias": (h,)})
    return shapes


def check_tensors(config: Mapping, shapes: Mapping[str, Sequence[int]], where: str) -> None:
    """Raise :class:`ExportError` unless ``shapes`` is exactly the expected name/shape set."""
    expected = expected_tensors(config)
    missing = sorted(expected.keys() - shapes.keys())
    extra = sorted(shapes.keys() - expected.keys())
    wrong = sorted(f"{n} {tuple(shapes[n])} (expected {expected[n]})"
                   for n in expected.keys() & shapes.keys() if tuple(shapes[n]) != expected[n])
    problems = [f"{len(names)} {kind}: {', '.join(names[:_SHOW])}"
                + (" ..." if len(names) > _SHOW else "")
                for kind, names in (("missing", missing), ("unexpected", extra),
                                    ("misshapen", wrong)) if names]
    if problems:
        raise ExportError(f"{where}: the tensors differ from what SGLang/vLLM load for this "
                          f"config.json ({'; '.join(problems)}); loaders skip such names "
                          "silently and would serve random weights")


def check_config(config: Mapping, where: str) -> None:
    """The DFlash fields every loader reads, present and consistent."""
    def fail(reason: str) -> None:
        raise ExportError(f"{where}: config.json {reason}")

    if config.get("architectures") != ["DFlashDraftModel"]:
        fail(f"has architectures={config.get('architectures')!r}, expected ['DFlashDraftModel']")
    for key in ("block_size", "num_target_layers", "dflash_config", "hidden_size",
                "num_hidden_layers", "vocab_size"):
        if key not in config:
            fail(f"lacks {key!r}")
    dflash = config["dflash_config"]
    taps, mask = dflash.get("target_layer_ids"), dflash.get("mask_token_id")
    last = int(config["num_target_layers"]) - 1
    if not taps or any(not 0 <= int(i) < last for i in taps):
        fail(f"has dflash_config.target_layer_ids={taps!r}: expected ids in 0..{last - 1} "
             "(the target's last layer cannot be captured by servers)")
    if mask is None or not 0 <= int(mask) < int(config["vocab_size"]):
        fail(f"has dflash_config.mask_token_id={mask!r} outside the vocabulary "
             f"0..{int(config['vocab_size']) - 1}")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in SERVED_ROPE_TYPES:
        fail(f"has rope_type={rope_type!r}: servers build the drafter's Qwen3 layers with one "
             f"of {list(SERVED_ROPE_TYPES)}")
    layer_types = config.get("layer_types")
    if layer_types is not None and len(layer_types) != int(config["num_hidden_layers"]):
        fail(f"has {len(layer_types)} layer_types for {config['num_hidden_layers']} layers")


def verify_export(folder: Union[str, Path]) -> None:
    """Check an export folder as written: config fields, tensor set and shapes, modeling file."""
    from safetensors import safe_open

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    check_config(config, str(folder))
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    check_tensors(config, shapes, str(folder / "model.safetensors"))
    module = config.get("auto_map", {}).get("AutoModel", "").split(".")[0]
    if not module or not (folder / f"{module}.py").is_file():
        raise ExportError(f"{folder}: config.json auto_map={config.get('auto_map')!r} names no "
                          "modeling file in the folder")
