"""Synthetic inputs at the real shape: a random-weight Qwen3-8B folder, batches and chat data.

Weights are random, but the architecture, the files and the loading path are the real ones:
the target is saved with ``save_pretrained`` and read back by ``from_pretrained``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from pipeline.model.config import qwen3_8b_config

WORDS = 600  # a vocabulary of whole-word tokens: a chat of n words is about n tokens


def build_target(out: Path, config: dict | None = None) -> Path:
    """Random bf16 Qwen3 with Qwen3-8B's exact architecture, plus a small word tokenizer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if (out / "config.json").exists():
        return out
    cfg = Qwen3Config(**{k: v for k, v in (config or qwen3_8b_config()).items()
                         if k != "architectures"})
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    del model
    # The caller (bench.e2e_8b, bench.h200_parallel) stays alive while the job it launches
    # runs on the same GPU: the allocator's cached 32 GB of the fp32 init would be kept from
    # it (on an 80 GB H100 the 8B job's evaluator ran out of memory, 2026-12-05).
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    word_tokenizer().save_pretrained(out)
    return out


def word_tokenizer():
    """A small BPE tokenizer whose tokens are whole words of write_chats's vocabulary."""
    from pipeline.assets.tokenizer import build_tokenizer

    return build_tokenizer([" ".join(_words())] * 4, vocab_size=4096)


def _words() -> list[str]:
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return sorted({"".join(rng.choice(letters) for _ in range(rng.randint(4, 7)))
                   for _ in range(WORDS)})


def write_chats(path: Path, count: int, prompt_words: int, answer_words: int) -> Path:
    """Chat JSONL whose answers hold about 3/4 of each sample's tokens."""
    rng = random.Random(1)
    words = _words()
    with path.open("w") as f:
        for _ in range(count):
            user = " ".join(rng.choice(words) for _ in range(prompt_words))
            answer = " ".join(rng.choice(words) for _ in range(answer_words))
            f.write(json.dumps({"messages": [{"role": "user", "content": user},
                                             {"role": "assistant", "content": answer}]}) + "\n")
    return path


def token_batch(n: int, seq_len: int, vocab: int, device: str, seed: int = 0):
    """(input_ids, loss_mask) with the first quarter unsupervised, as a prompt would be."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, seq_len), generator=g)
    mask = torch.zeros(n, seq_len, dtype=torch.long)
    mask[:, seq_len // 4:] = 1
    return ids.to(device), mask.to(device)
