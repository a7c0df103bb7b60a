"""Build the tiny assets into a directory: tokenizer, trained target, generated chat data.

Layout of the result::

    target/            Qwen3ForCausalLM + tokenizer (save_pretrained, safetensors)
    data/train.jsonl   {"messages": [user prompt, assistant = the target's greedy answer]}
    data/heldout.jsonl same, prompts from the end of the target's training text, a part no
                       training prompt is drawn from
    manifest.json      recipe, sizes, counts, timings; written last (marks a finished build)
"""

from __future__ import annotations

import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import asdict
from typing import Iterator

import torch

from pipeline.assets.chat_data import write_chat_data
from pipeline.assets.corpus import pydoc_topics, target_corpus
from pipeline.assets.recipe import ASSETS_VERSION, TinyRecipe
from pipeline.assets.target import build_target, train_target
from pipeline.assets.tokenizer import build_tokenizer

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
TARGET_DIR = "target"


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers' "Writing model shards" bar for a 2 MB model is noise in the demo's first
    run; the caller's setting is restored after."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


@contextmanager
def _one_thread() -> Iterator[None]:
    """One torch thread, then the caller's setting back.

    The tiny target's ops (hidden size 64) are too small for a second thread to pay for its
    synchronisation, and on a machine that other work keeps busy two spinning threads were
    several times slower (a build that takes 45 s of CPU with one thread had used 61 s, and
    not reached its 50th target step, with two at a load of 17).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build_tiny_assets(out_dir: str, recipe: TinyRecipe = TinyRecipe()) -> dict:
    """Build everything into ``out_dir`` (which must exist); returns the manifest."""
    start = time.perf_counter()
    timings = {}

    def lap(name: str) -> None:
        timings[name] = round(time.perf_counter() - start - sum(timings.values()), 2)

    with _one_thread():
        topics = pydoc_topics()
        tokenizer = build_tokenizer([text for _, text in topics], recipe.vocab_size)
        corpus = target_corpus(topics, recipe.target_corpus_chars, recipe.seed)
        stream = torch.tensor(tokenizer(corpus, add_special_tokens=False)["input_ids"])
        split_at = round(len(stream) * (1 - recipe.heldout_fraction))
        streams = {"train": stream[:split_at], "heldout": stream[split_at:]}
        lap("tokenizer")
        torch.manual_seed(recipe.seed)
        model = build_target(recipe, tokenizer)
        losses = train_target(model, tokenizer, stream, recipe)
        lap("train_target")
        target_dir = os.path.join(out_dir, TARGET_DIR)
        with _no_progress_bars():
            model.save_pretrained(target_dir)
            tokenizer.save_pretrained(target_dir)
        data = write_chat_data(model, tokenizer, streams, out_dir, recipe)
        lap("generate_data")
    manifest = {
        "version": ASSETS_VERSION, "seed": recipe.seed, "recipe": asdict(recipe),
        "vocab_size": len(tokenizer), "mask_token_id": tokenizer.mask_token_id,
        "target_params": sum(p.numel() for p in model.parameters()),
        "target_corpus_tokens": len(stream),
        "target_loss_first_last": [round(losses[0], 3), round(losses[-1], 3)],
        "data": data, "timings_s": timings,
        "build_time_s": round(time.perf_counter() - start, 2),
        "torch": torch.__version__, "threads": 1,
    }
    with open(os.path.join(out_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=2)
    return manifest
