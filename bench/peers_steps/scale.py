"""Sizes of bench/peers.py per scale: ``gpu`` (one H100 or H200, two device commands) and
``tiny`` (CPU, minutes; the test suite's path).

The data stages are bench/real_model.py's (a :class:`RealScale`); the rest is the race: each
trainer alone for ``budget_min`` minutes of training after its first step, checkpoints taken at
``marks`` (fractions of the budget), each decoded on ``decode_prompts`` prompts of HumanEval and
of the held-out explain set.

The gpu scale's sizes (a few thousand answers, a minute a trainer) are chosen so that the eight
runs and their decodes fit two device commands of ten minutes: `python -m bench.peers` stops
before a run that would not finish within ``--stop-after-min`` and the next call goes on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from bench.real_model_scale import TINY, RealScale


@dataclass(frozen=True)
class PeersScale:
    name: str
    data: RealScale  # the chain's data stages and the pipeline's overrides
    budget_min: float  # training minutes after each trainer's first step
    marks: tuple[float, ...] = (1 / 3, 2 / 3, 1.0)  # checkpoints, as fractions of the budget
    max_steps: Optional[int] = None  # a cap on top of the budget (tiny: a few steps)
    ours_checkpoint_every: int = 20  # the pipeline's checkpoint interval (steps)
    # The pipeline's schedule (cosine over its planned steps): epochs of the answers that about
    # fill the budget at its rate (4.7 steps/s of ~48 samples on an H200, docs/BENCHMARKS.md),
    # so it neither ends early nor is cut far from its end. None: the chain's.
    ours_epochs: Optional[int] = None
    # Per set (HumanEval, held-out explain); the decoder goes one prompt at a time, so these
    # two decide its minutes: each mark of each run is decoded on both sets.
    decode_prompts: int = 16
    decode_max_new_tokens: int = 64
    # ModelOpt pads every sample to its training_seq_len (recipe: 4096); None: the recipe's.
    modelopt_recipe_seq_len: Optional[int] = None
    # Speculators packs samples into rows of this many tokens (its default 8192).
    speculators_seq_len: int = 8192
    speculators_workers: int = 4
    # Its recipe's taps [2, n//2, n-3]; False where they collide (a 6-layer target): ours then.
    speculators_default_taps: bool = True
    # A run that would not end within this many minutes of the bench's start is left for the
    # next call (a device command may run 10 minutes).
    stop_after_min: Optional[float] = None
    # Seconds a run may take beyond its budget (start-up, saving, decoding) before it is
    # stopped; also what the bench reserves for one when it decides whether it still fits.
    run_overhead_s: float = 120.0

    def with_sizes(self, **sizes) -> "PeersScale":
        return dataclasses.replace(self, **{k: v for k, v in sizes.items() if v is not None})

    @property
    def mark_seconds(self) -> list[float]:
        return [round(self.budget_min * 60 * f, 3) for f in self.marks]


# The gpu scale: the chain's recipe (bench/real_model_scale.py) on 4,096 answers.
GPU_DATA = RealScale(name="gpu", device="cuda", train_prompts=4096, heldout_prompts=32,
                     humaneval_prompts=32, regen_batch_size=8192, regen_rows=4096,
                     eval_every=0, eval_prompts=24, regen_budget_s=240.0,
                     train_budget_s=240.0)
GPU = PeersScale(name="gpu", data=GPU_DATA, budget_min=1.0, ours_epochs=3)

# The CPU path: the tiny Llama GGUF, a few steps of each trainer that runs on CPU.
TINY_DATA = dataclasses.replace(TINY, train_prompts=16, heldout_prompts=2, humaneval_prompts=2,
                                max_new_tokens=12, eval_prompts=2, max_steps=4)
TINY_PEERS = PeersScale(name="tiny", data=TINY_DATA, budget_min=0.25, max_steps=4,
                        ours_checkpoint_every=1, decode_prompts=2, decode_max_new_tokens=12,
                        modelopt_recipe_seq_len=512, speculators_seq_len=512, speculators_workers=1,
                        speculators_default_taps=False,
                        run_overhead_s=300.0)

SCALES = {s.name: s for s in (GPU, TINY_PEERS)}
