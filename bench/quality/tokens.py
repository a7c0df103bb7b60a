"""The tokenizer (byte-level BPE, ChatML, mask token) and the corpus as token streams."""

from __future__ import annotations

import random

import numpy as np
import torch

from bench.quality.corpus import Corpus
from pipeline.assets.tokenizer import build_tokenizer

# Between two files in a stream: a blank-line run the model sees as "a new file starts".
DOC_SEPARATOR = "\n\n\n"
_ENCODE_SLICE = 512  # documents per tokenizer call


def train_tokenizer(corpus: Corpus, vocab_size: int, sample_chars: int, seed: int):
    """BPE trained on a seeded subsample of training files (about ``sample_chars`` chars).

    A subsample keeps training under a minute; the merges of code are well covered by it.
    """
    order = list(range(len(corpus.train)))
    random.Random(seed).shuffle(order)
    texts, total = [], 0
    for i in order:
        if total >= sample_chars:
            break
        texts.append(corpus.train[i][1])
        total += len(texts[-1])
    return build_tokenizer(texts, vocab_size)


def encode_stream(tokenizer, docs: list[tuple[str, str]]) -> torch.Tensor:
    """All documents, in order, as one int32 token stream with separators between them."""
    sep = np.asarray(tokenizer(DOC_SEPARATOR, add_special_tokens=False)["input_ids"],
                     dtype=np.int32)
    parts: list[np.ndarray] = []
    # In slices: the whole corpus (tens of millions of tokens) as Python ints would take GBs.
    for i in range(0, len(docs), _ENCODE_SLICE):
        texts = [text for _, text in docs[i:i + _ENCODE_SLICE]]
        for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
            parts += [np.asarray(ids, dtype=np.int32), sep]
    return torch.from_numpy(np.concatenate(parts)) if parts else torch.zeros(0, dtype=torch.int32)
