"""The training answers as every trainer of the race gets them: the pipeline's own sample set.

The pipeline (pipeline/data/dataset.py ChatDataset) keeps a sample with at least two of its
blocks of supervised tokens after its ``max_length`` cut. The peers get exactly those samples,
with the same tokens and loss masks, each cut to the peer's own sequence length: a peer never
trains on an answer the pipeline left out, nor misses one it kept (a peer whose sequence length
is shorter than the pipeline's may find fewer supervised tokens in a sample, and leaves out
one with none left)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SampleSet:
    """Which samples the pipeline keeps: its ``data.max_length`` and ``drafter.block_size``."""

    max_length: int
    block_size: int

    @classmethod
    def of(cls, data_scale) -> "SampleSet":
        return cls(data_scale.max_length, data_scale.block_size)


def encoded_samples(tokenizer, train_path: str, seq_len: int, kept: SampleSet) -> list[dict]:
    """``{"input_ids", "loss_mask"}`` rows cut to ``seq_len``, in the pipeline's sample order."""
    from pipeline.data.config import DataConfig
    from pipeline.data.dataset import ChatDataset

    # Read at the longer of the two lengths: the pipeline's cut decides which samples count,
    # the peer's cut what each row holds.
    data = ChatDataset(train_path, tokenizer,
                       DataConfig(train_path=train_path, max_length=max(seq_len, kept.max_length)),
                       kept.block_size)
    rows = []
    for sample in data:
        mask = sample.loss_mask.tolist()
        if sum(mask[:kept.max_length]) < 2 * kept.block_size or not sum(mask[:seq_len]):
            continue
        rows.append({"input_ids": sample.input_ids[:seq_len].tolist(), "loss_mask": mask[:seq_len]})
    return rows
