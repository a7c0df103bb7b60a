"""The demo's first 5 losses on a fixed tiny setup, against a stored golden file.

The Ray path is checked against the single-process reference elsewhere; this catches a change
that shifts both alike (the loss, the masks, the init, the data order). Every setting that
shapes the numbers is pinned here rather than taken from conf/, so retuning a preset does not
move the golden values. The tolerance covers float differences between CPUs (other SIMD
kernels), not a change of the computation. After an intended change, rewrite the file with
``DFLASH_UPDATE_GOLDEN=1 python -m pytest tests/training/test_golden_losses.py``.
"""

import json
import os
from pathlib import Path

import pytest

from pipeline.driver.compose import compose_job
from pipeline.training.single import SingleProcessTrainer

GOLDEN = Path(__file__).parent / "golden" / "demo_losses.json"
RTOL = 2e-3
SETUP = ["cluster.device=cpu", "cluster.drafters_per_node=2", "target.dtype=float32",
         "train.precision=fp32", "data.micro_batch_size=2", "data.max_length=256",
         "data.seed=0", "data.format=auto", "drafter.num_layers=2", "drafter.block_size=8",
         "drafter.num_taps=3", "drafter.num_anchors=32", "drafter.attention=sdpa",
         "drafter.compile=off", "train.seed=0", "train.plan.epochs=1", "train.plan.max_steps=5",
         "train.plan.grad_accum=1", "train.optim.lr=1e-3", "train.optim.warmup_ratio=0.0",
         "train.optim.min_lr_ratio=0.0", "train.optim.weight_decay=0.0",
         "train.optim.grad_clip=1.0", "train.eval.every=-1"]


def test_first_five_losses_match_the_golden_file(small_train_file, tmp_path):
    job = compose_job(SETUP + [f"data.train_path={small_train_file}",
                               f"train.out_dir={tmp_path}"])
    losses = [row["train/loss"] for row in SingleProcessTrainer(job).train()]
    assert len(losses) == 5
    if os.environ.get("DFLASH_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({"setup": SETUP, "data": "first 24 lines of the tiny "
                                      "train data (tests/conftest.py small_train_file)",
                                      "losses": losses}, indent=2) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert golden["setup"] == SETUP, "the setup changed: regenerate the golden file"
    assert losses == pytest.approx(golden["losses"], rel=RTOL), (
        f"losses {losses} moved from the golden {golden['losses']}; if the change is "
        "intended, regenerate with DFLASH_UPDATE_GOLDEN=1 (see this file's docstring)")
    assert losses[-1] < losses[0], "five steps did not lower the loss: a vacuous golden"
