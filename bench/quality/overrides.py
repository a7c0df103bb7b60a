"""The Hydra overrides both drafter trainers get: ``pipeline.train`` and ``pipeline.train_single``.

>>> THE ONE LIST OF CONFIG KEYS <<<  Every pipeline config key this benchmark sets is in
:func:`trainer_overrides` below and nowhere else. When keys are renamed (e.g. ``train.lr`` ->
``train.optim.lr``), update them here; the tiny run (``--scale tiny``) checks them on CPU,
because the trainers reject unknown keys before any actor starts.
"""

from __future__ import annotations

from bench.quality.scale import Scale


def trainer_overrides(scale: Scale, target_dir: str, train_path: str, heldout_path: str,
                      out_dir: str) -> list[str]:
    """Identical for both trainers except ``out_dir``, so they follow the same step plan."""
    return [
        # --- selected groups -------------------------------------------------------------
        "cluster=one_gpu",  # 1 target + 1 drafter actor sharing one GPU (CUDA IPC on it)
        "logger=none",  # no wandb on the GPU machine; metrics.jsonl is always written
        # --- target ----------------------------------------------------------------------
        f"target.path={target_dir}",
        "target.dtype=auto",  # bfloat16 on CUDA, float32 on CPU
        # --- cluster ---------------------------------------------------------------------
        f"cluster.device={scale.cluster_device}",
        f"cluster.cpus_per_actor={scale.cpus_per_actor}",
        # --- drafter (taps: the default spread over the target's layers) ----------------
        f"drafter.num_layers={scale.drafter_layers}",
        f"drafter.block_size={scale.block_size}",
        f"drafter.num_taps={scale.num_taps}",
        f"drafter.num_anchors={scale.num_anchors}",
        f"drafter.gamma={scale.gamma}",
        f"drafter.init={scale.init}",
        f"drafter.attention={scale.attention}",
        f"drafter.compile={scale.compile}",
        "drafter.static_shapes=true",
        # --- data ------------------------------------------------------------------------
        f"data.train_path={train_path}",
        f"data.heldout_path={heldout_path}",  # only its prompts are used: for tau
        f"data.max_length={scale.data_max_length}",
        f"data.micro_batch_size={scale.micro_batch_size}",
        # --- train -----------------------------------------------------------------------
        f"train.plan.epochs={scale.epochs}",
        f"train.plan.max_steps={scale.max_steps}",
        "train.plan.grad_accum=1",
        f"train.optim.lr={scale.drafter_lr}",
        "train.optim.warmup_ratio=0.04",
        "train.optim.min_lr_ratio=0.1",
        f"train.eval.every={scale.eval_every}",  # pipeline.train only; train_single: end
        f"train.eval.prompts={scale.eval_prompts}",
        f"train.eval.max_new_tokens={scale.eval_max_new_tokens}",
        "train.log_every=50",
        "train.checkpoint.every=0",  # a final checkpoint is still written
        f"train.out_dir={out_dir}",
    ]
