"""The runs of the race: each trainer with a recipe, as a list of overrides in its own syntax.

- ``ours``: Hydra overrides of ``python -m pipeline.train --config-name smollm2_135m`` on top of
  the real-model chain's (bench/real_model_scale.py trainer_overrides);
- ``modelopt``: dotlist overrides of ModelOpt's own DFlash recipe (the ``dflash.yaml`` its wheel
  ships under ``modelopt_recipes/general/speculative_decoding``), its sections ``dflash.*`` and
  ``training.*``;
- ``speculators``: flags of ``python -m speculators.train`` (its defaults are its recipe).

"our shape" is the pipeline's drafter where a peer exposes the knob: 5 layers, block 16, its
taps and mask token, 256 anchors a sample and lr 1.5e-3 (the smollm2_135m preset); the rest
stays the peer's. A run is added by adding a row here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from bench.peers_steps.scale import PeersScale

Trainer = Literal["ours", "modelopt", "speculators"]
TRAINERS = ("ours", "modelopt", "speculators")


@dataclass(frozen=True)
class Run:
    name: str
    trainer: Trainer
    recipe: str  # what the overrides mean, in words
    overrides: tuple[str, ...] = field(default_factory=tuple)


def our_shape(scale: PeersScale) -> dict:
    """The pipeline's drafter at this scale: what the peers get at "our shape"."""
    d = scale.data
    taps = d.target_layer_ids or (1, 8, 14, 20, 27)  # the smollm2_135m preset's
    return {"layers": d.drafter_layers, "block": d.block_size, "anchors": d.num_anchors,
            "lr": d.lr, "taps": list(taps), "mask": d.mask_token_id or 16,
            "seq_len": d.max_length}


def runs(scale: PeersScale) -> list[Run]:
    s = our_shape(scale)
    taps = ",".join(map(str, s["taps"]))
    spec_taps = [str(i + 1) for i in s["taps"]]  # speculators' id i is z-lab's i - 1
    mo_recipe_seq = scale.modelopt_recipe_seq_len
    return [
        Run("ours_ce_decay", "ours", "cross-entropy, today's decay (the preset)"),
        Run("ours_dpace", "ours", "cross-entropy, D-PACE position weights",
            ("drafter.position_weights=dpace", "drafter.gamma=null")),
        Run("ours_distill", "ours", "distillation from the target's logits (lambda 1, T 1)",
            ("drafter.distill_weight=1.0",)),
        Run("ours_distill_dpace", "ours", "distillation + D-PACE",
            ("drafter.distill_weight=1.0", "drafter.position_weights=dpace",
             "drafter.gamma=null")),
        Run("modelopt_recipe", "modelopt",
            "its dflash.yaml: block 8, 512 anchors, 5 layers, lr 6e-4, D-PACE, distillation",
            (f"dflash.dflash_mask_token_id={s['mask']}",
             *((f"training.training_seq_len={mo_recipe_seq}",) if mo_recipe_seq else ()))),
        Run("modelopt_our_shape", "modelopt",
            "its recipe at our drafter's shape: block 16, our anchors, taps and lr",
            (f"dflash.dflash_mask_token_id={s['mask']}", f"dflash.dflash_block_size={s['block']}",
             f"dflash.dflash_num_anchors={s['anchors']}",
             f"dflash.dflash_architecture_config.num_hidden_layers={s['layers']}",
             # one tap per draft layer, as ModelOpt requires (else its own spread)
             *((f"dflash.dflash_architecture_config.target_layer_ids=[{taps}]",)
               if len(s["taps"]) == s["layers"] else ()),
             f"training.learning_rate={s['lr']}", f"training.training_seq_len={s['seq_len']}")),
        Run("speculators_recipe", "speculators",
            "its defaults: 5 layers, block 16, CE + D-PACE, Muon lr 1e-3, 512 anchors a row",
            (f"--mask-token-id={s['mask']}",
             *(() if scale.speculators_default_taps else ("--target-layer-ids", *spec_taps)))),
        Run("speculators_our_shape", "speculators",
            "its recipe at our drafter's shape: our taps, anchors per row = every "
            "supervised position, lr",
            (f"--mask-token-id={s['mask']}", f"--num-layers={s['layers']}",
             f"--block-size={s['block']}", "--target-layer-ids", *spec_taps,
             f"--max-anchors={scale.speculators_seq_len // 2}", f"--lr={s['lr']}")),
    ]


def select(all_runs: list[Run], names: list[str] | None) -> list[Run]:
    """The runs named (all when none), in the registry's order; an unknown name is refused."""
    if not names:
        return all_runs
    known = {r.name for r in all_runs}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"--runs {' '.join(unknown)}: unknown; choose from {sorted(known)}")
    return [r for r in all_runs if r.name in names]
