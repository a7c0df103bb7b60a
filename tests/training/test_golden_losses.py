"""The demo's first 5 losses on a fixed tiny setup, against a stored golden file.

The Ray path is checked against the single-process reference elsewhere; this catches a change
that shifts both alike (the loss, the masks, the init, the data order). Every setting that
shapes the numbers is pinned here rather than taken from conf/, so retuning a preset does not
move the golden values.

The inputs are shipped, not built: the tiny demo assets (pipeline/assets/) come from a target
trained on the machine, a tokenizer trained on the running Python's help texts and chat data
the target generated greedily, so they differ between machines and Python versions, and no
tolerance absorbs that. Here the tokenizer (a copy of the tiny target's: tokenizer.json,
tokenizer_config.json, chat_template.jinja) and 24 chat lines (the first 24 of the tiny train
data, chat.jsonl) live in tests/training/golden/; the target is a seeded random-init Qwen3 of
the tiny recipe's shape, saved with save_pretrained next to a copy of that tokenizer, so the
real HF loading path is used. Random init and 5 steps amplify float noise only a little: the
tolerance covers float differences between CPUs and thread counts (other SIMD kernels, other
reduction orders), not a change of the computation. After an intended change, rewrite the file
with ``DFLASH_UPDATE_GOLDEN=1 python -m pytest tests/training/test_golden_losses.py``.
"""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from pipeline.driver.compose import compose_job
from pipeline.reference.trainer import SingleProcessTrainer

HERE = Path(__file__).parent / "golden"
GOLDEN = HERE / "demo_losses.json"
CHAT = HERE / "chat.jsonl"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
MASK_ID = 3  # <|mask|> in the shipped tokenizer (pipeline/assets/tokenizer.py)
# Measured on one machine: 1 vs 2 threads give identical losses, scalar vs AVX2 ATen kernels
# (ATEN_CPU_CAPABILITY=default) differ by 4e-8 relative. The losses of a random target sit near
# ln(vocab) ~ 7.6, so a real change moves them little (num_anchors 32 -> 16: 1e-3; another
# train or data seed: 5e-3): the tolerance is tight, yet far above float noise.
RTOL = 1e-4
SETUP = ["cluster.device=cpu", "cluster.drafters_per_node=2", "target.dtype=float32",
         "train.precision=fp32", "data.micro_batch_size=2", "data.max_length=256",
         "data.seed=0", "data.format=auto", "drafter.num_layers=2", "drafter.block_size=8",
         "drafter.num_taps=3", "drafter.num_anchors=32", "drafter.attention=sdpa",
         "drafter.compile=off", f"drafter.mask_token_id={MASK_ID}",
         "drafter.gamma=null", "drafter.init=random", "train.seed=0",
         "train.plan.epochs=1", "train.plan.max_steps=5", "train.plan.grad_accum=1",
         "train.optim.lr=1e-3", "train.optim.warmup_ratio=0.0", "train.optim.min_lr_ratio=0.0",
         "train.optim.weight_decay=0.0", "train.optim.grad_clip=1.0", "train.eval.every=-1"]


@pytest.fixture()
def golden_target_dir(tmp_path):
    """A seeded random-init Qwen3 with the tiny target's shape, next to the shipped tokenizer."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    path = tmp_path / "target"
    path.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy(HERE / name, path / name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert tokenizer.mask_token_id == MASK_ID and len(tokenizer) == 2048
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=192, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    Qwen3ForCausalLM(config).save_pretrained(path)
    return path


def test_first_five_losses_match_the_golden_file(golden_target_dir, tmp_path):
    job = compose_job(SETUP + [f"target.path={golden_target_dir}", f"data.train_path={CHAT}",
                               f"data.heldout_path={CHAT}", f"train.out_dir={tmp_path / 'out'}"])
    losses = [row["train/loss"] for row in SingleProcessTrainer(job).train()]
    assert len(losses) == 5
    if os.environ.get("DFLASH_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps({
            "setup": SETUP,
            "inputs": "tests/training/golden/: the shipped tokenizer and chat.jsonl; target: "
                      "seeded random-init Qwen3 (this test's golden_target_dir)",
            "losses": losses}, indent=2) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert golden["setup"] == SETUP, "the setup changed: regenerate the golden file"
    assert losses == pytest.approx(golden["losses"], rel=RTOL), (
        f"losses {losses} moved from the golden {golden['losses']}; if the change is "
        "intended, regenerate with DFLASH_UPDATE_GOLDEN=1 (see this file's docstring)")
    assert losses[-1] < losses[0], "five steps did not lower the loss: a vacuous golden"
