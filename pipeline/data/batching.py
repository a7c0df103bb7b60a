"""Epoch order, micro-batches and padding: which samples train together, and in what shape."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from pipeline.data.dataset import Sample


def _generator_seed(seed: int, epoch: int) -> int:
    # A hash rather than arithmetic: (seed, epoch) pairs never collide (seed*K + epoch would
    # make seed 1 epoch 0 equal seed 0 epoch K), and the result is the same on every machine.
    digest = hashlib.sha256(f"dflash-epoch:{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def epoch_order(sample_ids: Sequence[int], seed: int, epoch: int) -> list[int]:
    """A permutation of ``sample_ids`` that depends only on (the set of ids, seed, epoch).

    The ids are sorted first, so callers that list them in a different order still agree.
    """
    ids = sorted(sample_ids)
    if len(set(ids)) != len(ids):
        raise ValueError("sample_ids contains duplicates; each sample id must appear once")
    generator = torch.Generator().manual_seed(_generator_seed(seed, epoch))
    return [ids[i] for i in torch.randperm(len(ids), generator=generator).tolist()]


def micro_batches(order: Sequence[int], micro_batch_size: int) -> list[list[int]]:
    """Consecutive chunks of ``order``; the last one may be smaller (no sample is dropped)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size!r} is not allowed: "
                         f"expected an int >= 1")
    return [list(order[i:i + micro_batch_size]) for i in range(0, len(order), micro_batch_size)]


@dataclass
class Batch:
    sample_ids: list[int]
    input_ids: torch.Tensor  # int64 [N, S], right-padded with the pad id
    loss_mask: torch.Tensor  # int64 [N, S], 0 on padding
    lengths: torch.Tensor  # int64 [N], tokens before padding

    @property
    def num_supervised(self) -> int:
        return int(self.loss_mask.sum())

    def attention_mask(self) -> torch.Tensor:
        return attention_mask(self.lengths, self.input_ids.shape[1])


def attention_mask(lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[N, S] int64: 1 on real tokens, 0 on right padding."""
    return (torch.arange(seq_len)[None] < lengths[:, None]).long()


def collate(samples: Sequence[Sample], pad_id: int, pad_to: Optional[int] = None) -> Batch:
    """Right-pad samples into one batch; ``pad_to`` fixes S for static shapes (compilation)."""
    if not samples:
        raise ValueError("collate needs at least one sample")
    lengths = [int(s.input_ids.numel()) for s in samples]
    width = max(lengths)
    if pad_to is not None:
        if pad_to < width:
            raise ValueError(f"pad_to={pad_to} is shorter than the longest sample ({width} "
                             f"tokens, id {samples[lengths.index(width)].sample_id}); raise "
                             f"pad_to or lower data.max_length")
        width = pad_to
    input_ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((len(samples), width), dtype=torch.long)
    for row, (sample, n) in enumerate(zip(samples, lengths)):
        input_ids[row, :n] = sample.input_ids
        loss_mask[row, :n] = sample.loss_mask
    return Batch([s.sample_id for s in samples], input_ids, loss_mask,
                 torch.tensor(lengths, dtype=torch.long))
