"""Drafter options and the HF-style config.json that DFlash loaders read.

The drafter takes its shapes from the target (hidden size, heads, rope; per family, see
pipeline/model/families.py) and adds the
DFlash fields listed in dflash.md: ``architectures``, ``block_size``, ``num_target_layers``,
``dflash_config`` and ``layer_types``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from pipeline.model.families import drafter_fields
from pipeline.checks.validate import require, require_choice


ATTENTION = ("sdpa", "flex")
COMPILE_MODES = ("off", "default", "reduce-overhead")
# replicate: full replicas, gradients all-reduced; fsdp: weights and AdamW state sharded with
# FSDP2 (pipeline/dist/fsdp.py).
PARALLEL_MODES = ("replicate", "fsdp")
# random: every weight drawn from the seed; target_layers: the decoder layers (and final
# norm) copied from the target's last layers, fc and hidden_norm random (model/target_init.py).
INIT_MODES = ("random", "target_layers")
# decay: DFlash's exp(-(k-1)/gamma); dpace: D-PACE's confidence-derived weights
# (pipeline/objective/dpace.py), which replace the decay, as in ModelOpt and speculators.
POSITION_WEIGHTS = ("decay", "dpace")
# D-PACE's smoothing, as ModelOpt and speculators default it (the paper finds [0.3, 0.7] stable).
DEFAULT_DPACE_ALPHA = 0.5
DEFAULT_DISTILL_TEMPERATURE = 1.0
# Targets whose decoder layers are the drafter's own kind, for target_layers: Qwen3's, and
# Llama's, which are Qwen3's without the q/k norms (those start at ones: model/target_init.py).
INIT_FAMILIES = ("qwen3", "llama")
# Config keys of a family that add weights a Qwen3 layer has no place for (a copy would drop them).
_INIT_REFUSED_IF = ("attention_bias", "mlp_bias")


@dataclass
class DrafterConfig:
    """What a user chooses about the drafter; everything else comes from the target config."""

    num_layers: int = 1
    block_size: int = 16
    # None: spread ``num_taps`` evenly from layer 1 to layer T-3 (dflash.md).
    target_layer_ids: Optional[list[int]] = None
    num_taps: int = 5
    # None: the tokenizer's mask token.
    mask_token_id: Optional[int] = None
    num_anchors: int = 512
    # None: 7 for B=16, 5 for B=10, 4 for B=8 (dflash.md), else B/2.3 rounded.
    gamma: Optional[float] = None
    attention: str = "sdpa"  # one of ATTENTION
    compile: str = "off"  # one of COMPILE_MODES
    loss_chunk_size: int = 4096
    # Pad every micro-batch to data.max_length and num_anchors blocks: static shapes, which
    # CUDA graphs need, at the cost of computing padding.
    static_shapes: bool = False
    parallel: str = "replicate"  # one of PARALLEL_MODES
    init: str = "random"  # one of INIT_MODES
    # With init=target_layers: the target layer each drafter layer is copied from, one id per
    # drafter layer; None: the target's last num_layers layers, in order.
    init_layer_ids: Optional[list[int]] = None
    # How block positions weigh in the loss: decay, exp(-(k-1)/gamma); dpace, D-PACE's weights
    # from the drafter's own confidence, in place of the decay (gamma null); docs/OBJECTIVES.md.
    position_weights: str = "decay"  # one of POSITION_WEIGHTS
    # D-PACE's smoothing of the confidence q: alpha + (1 - alpha) q, alpha in (0, 1]; only
    # with position_weights=dpace (otherwise it must stay at its default).
    dpace_alpha: float = DEFAULT_DPACE_ALPHA
    # lambda: a scored position's loss is (1 - lambda) * CE + lambda * T^2 * KL(p_T || q_T)
    # against the target's own next-token distribution there; 0: CE alone.
    distill_weight: float = 0.0
    # T of the distillation term, > 0; only with distill_weight > 0 (otherwise it must stay
    # at its default).
    distill_temperature: float = DEFAULT_DISTILL_TEMPERATURE

    def __post_init__(self) -> None:
        require(self.num_layers >= 1, "drafter.num_layers", self.num_layers, ">= 1")
        require(self.block_size >= 2, "drafter.block_size", self.block_size, ">= 2")
        require(self.num_taps >= 1, "drafter.num_taps", self.num_taps, ">= 1")
        require(self.num_anchors >= 1, "drafter.num_anchors", self.num_anchors, ">= 1")
        require(self.loss_chunk_size >= 1, "drafter.loss_chunk_size", self.loss_chunk_size, ">= 1")
        require(self.gamma is None or self.gamma > 0, "drafter.gamma", self.gamma, "> 0 or null")
        require_choice("drafter.attention", self.attention, ATTENTION)
        require_choice("drafter.compile", self.compile, COMPILE_MODES)
        require_choice("drafter.parallel", self.parallel, PARALLEL_MODES)
        require_choice("drafter.init", self.init, INIT_MODES)
        if self.init_layer_ids is not None:
            require(self.init == "target_layers", "drafter.init_layer_ids",
                    self.init_layer_ids, "null unless drafter.init=target_layers")
            require(len(self.init_layer_ids) == self.num_layers,
                    "drafter.init_layer_ids", self.init_layer_ids,
                    f"one target layer id per drafter layer ({self.num_layers})")
        # FSDP2 swaps parameter storage between shards and gathered copies, which compiled
        # graphs (and CUDA graphs above all) would capture; not supported yet.
        require(self.parallel == "replicate" or self.compile == "off", "drafter.compile",
                self.compile, "off with drafter.parallel=fsdp (compiled FSDP2 drafters are "
                "not supported yet)")
        if self.target_layer_ids is not None:
            require(len(self.target_layer_ids) >= 1 and min(self.target_layer_ids) >= 0,
                     "drafter.target_layer_ids", self.target_layer_ids, "non-empty, ids >= 0")
        self._check_objective()

    def _check_objective(self) -> None:
        """The loss keys. A key the chosen objective does not read must keep its default:
        a value set there would be accepted and then ignored."""
        require_choice("drafter.position_weights", self.position_weights, POSITION_WEIGHTS)
        dpace = self.position_weights == "dpace"
        # alpha 0 lets the chain vanish with one confident miss; both peers refuse it too.
        require(0.0 < self.dpace_alpha <= 1.0, "drafter.dpace_alpha", self.dpace_alpha,
                "in (0, 1]")
        require(dpace or self.dpace_alpha == DEFAULT_DPACE_ALPHA, "drafter.dpace_alpha",
                self.dpace_alpha, f"{DEFAULT_DPACE_ALPHA} (unused) unless "
                "drafter.position_weights=dpace")
        require(not dpace or self.gamma is None, "drafter.gamma", self.gamma,
                "null with drafter.position_weights=dpace (D-PACE weights replace the "
                "exp(-(k-1)/gamma) decay)")
        require(0.0 <= self.distill_weight <= 1.0, "drafter.distill_weight",
                self.distill_weight, "in [0, 1] (0: cross-entropy alone)")
        require(self.distill_temperature > 0, "drafter.distill_temperature",
                self.distill_temperature, "> 0")
        require(self.distills or self.distill_temperature == DEFAULT_DISTILL_TEMPERATURE,
                "drafter.distill_temperature", self.distill_temperature,
                f"{DEFAULT_DISTILL_TEMPERATURE} (unused) unless drafter.distill_weight > 0")

    @property
    def distills(self) -> bool:
        """Whether the target hands over its final normed hidden state beside the taps."""
        return self.distill_weight > 0

    def resolved_gamma(self) -> float:
        return self.gamma if self.gamma is not None else default_gamma(self.block_size)


def feature_width(spec: "DrafterSpec", options: DrafterConfig) -> int:
    """Per token, what a target hands a drafter: the taps, then (distilling) the target's final
    normed hidden state, H wide; the drafter reads the taps, its loss the last column block."""
    return spec.feature_size + (spec.hidden_size if options.distills else 0)


def default_gamma(block_size: int) -> float:
    table = {16: 7.0, 10: 5.0, 8: 4.0}
    return table.get(block_size, round(block_size / 2.3, 2))


def default_tap_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """Taps spread evenly from layer 1 to layer T-3; a single tap sits in the middle."""
    if num_taps == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_taps - 1)) for i in range(num_taps)]


def resolve_tap_ids(cfg: DrafterConfig, num_target_layers: int) -> list[int]:
    ids = cfg.target_layer_ids or default_tap_ids(num_target_layers, cfg.num_taps)
    last = num_target_layers - 1
    bad = [i for i in ids if not 0 <= i < num_target_layers]
    if bad:
        raise ValueError(
            f"drafter.target_layer_ids={list(ids)} has ids {bad} outside the target's "
            f"{num_target_layers} layers: allowed 0..{last - 1}")
    if last in ids:
        raise ValueError(
            f"drafter.target_layer_ids={list(ids)} taps the target's last layer ({last}), "
            f"which servers cannot capture: SGLang records layer i's output before layer i+1 "
            f"runs, which never happens for the last layer (sglang issue 32204), and SGLang, "
            f"vLLM and HF disagree on whether that output is taken before or after the final "
            f"norm; allowed 0..{last - 1}")
    return list(ids)


def resolve_init_layer_ids(cfg: DrafterConfig, num_target_layers: int) -> list[int]:
    """The target layers drafter.init=target_layers copies, checked against the target."""
    if cfg.num_layers > num_target_layers:
        raise ValueError(f"drafter.init=target_layers needs drafter.num_layers={cfg.num_layers} "
                         f"<= the target's {num_target_layers} layers")
    ids = cfg.init_layer_ids
    if ids is None:
        return list(range(num_target_layers - cfg.num_layers, num_target_layers))
    bad = [i for i in ids if not 0 <= i < num_target_layers]
    if bad:
        raise ValueError(f"drafter.init_layer_ids={list(ids)} has ids {bad} outside the "
                         f"target's {num_target_layers} layers: allowed 0..{num_target_layers - 1}")
    return list(ids)


@dataclass(frozen=True)
class DrafterSpec:
    """The resolved drafter: HF config dict plus the fields the code reads often."""

    hf_config: dict
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]

    @property
    def hidden_size(self) -> int:
        return int(self.hf_config["hidden_size"])

    @property
    def feature_size(self) -> int:
        """Width of the concatenated tap features that the target hands over."""
        return self.hidden_size * len(self.target_layer_ids)

    @classmethod
    def from_hf_config(cls, hf_config: dict) -> "DrafterSpec":
        dflash = hf_config["dflash_config"]
        return cls(hf_config=hf_config, block_size=int(hf_config["block_size"]),
                   mask_token_id=int(dflash["mask_token_id"]),
                   target_layer_ids=tuple(int(i) for i in dflash["target_layer_ids"]))


def build_drafter_spec(target_config: dict, cfg: DrafterConfig,
                       tokenizer_mask_id: Optional[int] = None) -> DrafterSpec:
    """A Qwen3-shaped drafter config derived from the target's config dict (``to_dict()``):
    what it takes from the target is decided per family in pipeline/model/families.py."""
    fields = drafter_fields(target_config)  # refuses a family it cannot serve
    num_target_layers = int(target_config["num_hidden_layers"])
    vocab = fields["vocab_size"]
    taps = resolve_tap_ids(cfg, num_target_layers)
    if cfg.init == "target_layers":  # refused here, before any actor starts
        # Copying by parameter name is only sound where the target's layer is the drafter's
        # kind: Gemma's norms, say, share Qwen3's names but scale by (1 + weight).
        if target_config.get("model_type") not in INIT_FAMILIES:
            raise ValueError(f"drafter.init=target_layers: the target's layers "
                             f"(model_type={target_config.get('model_type')!r}) are not the "
                             f"drafter's Qwen3 layers; allowed for model_type in "
                             f"{list(INIT_FAMILIES)}, else drafter.init=random")
        biased = [k for k in _INIT_REFUSED_IF if target_config.get(k)]
        if biased:
            raise ValueError(f"drafter.init=target_layers: the target's layers have biases "
                             f"({', '.join(f'{k}=true' for k in biased)}), which the drafter's "
                             f"Qwen3 layers lack; use drafter.init=random")
        resolve_init_layer_ids(cfg, num_target_layers)
    mask_id = cfg.mask_token_id if cfg.mask_token_id is not None else tokenizer_mask_id
    if mask_id is None:
        raise ValueError("drafter.mask_token_id=null and the tokenizer has no mask token: "
                         f"set drafter.mask_token_id to a token id in 0..{vocab - 1}")
    if not 0 <= mask_id < vocab:
        raise ValueError(f"drafter.mask_token_id={mask_id} is outside the target vocabulary: "
                         f"allowed 0..{vocab - 1}")
    hf = dict(
        fields,
        architectures=["DFlashDraftModel"],
        model_type="qwen3",
        num_hidden_layers=cfg.num_layers,
        block_size=cfg.block_size,
        num_target_layers=num_target_layers,
        dflash_config={"mask_token_id": int(mask_id), "target_layer_ids": taps},
        layer_types=["full_attention"] * cfg.num_layers,
        tie_word_embeddings=False,
        use_sliding_window=False,
    )
    return DrafterSpec(hf_config=hf, block_size=cfg.block_size, mask_token_id=int(mask_id),
                       target_layer_ids=tuple(taps))


def qwen3_8b_config() -> dict:
    """Qwen3-8B's published config (the fields a drafter derives from); used by tests."""
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
        "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
    }


def hf_qwen3_config(hf_config: dict) -> Any:
    """A transformers Qwen3Config carrying the drafter dims (for HF's RoPE and MLP modules)."""
    from transformers import Qwen3Config

    known = {k: v for k, v in hf_config.items() if k not in ("architectures",)}
    return Qwen3Config(**known)


__all__ = ["DrafterConfig", "DrafterSpec", "build_drafter_spec", "default_tap_ids",
           "feature_width",
           "resolve_init_layer_ids",
           "default_gamma", "resolve_tap_ids", "qwen3_8b_config", "hf_qwen3_config"]
