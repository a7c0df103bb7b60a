"""Epoch order, micro-batches and padding: which samples train together, and in what shape."""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import torch

from pipeline.data.config import DataConfig
from pipeline.data.dataset import Sample
from pipeline.objective.anchors import valid_anchor_positions


def _generator_seed(seed: int, epoch: int, salt: str = "dflash-epoch") -> int:
    # A hash rather than arithmetic: (seed, epoch) pairs never collide (seed*K + epoch would
    # make seed 1 epoch 0 equal seed 0 epoch K), and the result is the same on every machine.
    digest = hashlib.sha256(f"{salt}:{seed}:{epoch}".encode()).digest()
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


@dataclass(frozen=True)
class BatchShapes:
    """How micro-batches are cut and padded, resolved once from the data and drafter config.

    Pad mode (``buckets`` empty): ``micro_batch_size`` samples per micro-batch, padded to
    ``pad_to`` (None: the longest of the batch); with ``pad_to`` set (static shapes) an
    epoch's last, smaller micro-batch is also padded with empty rows to ``micro_batch_size``,
    so that no micro-batch is a new shape to compile. Bucket mode: bucket ``i`` holds the samples
    of length in (buckets[i-1], buckets[i]]; its micro-batches have ``rows[i]`` samples
    (fewer in its last one of an epoch), padded to ``buckets[i]``. Pack mode (``pool`` set):
    as buckets, but a micro-batch holds up to ``rows[i]`` samples whose anchors fit the pool,
    and is padded with empty rows to ``rows[i]`` (one target shape per bucket).
    """

    micro_batch_size: int
    pad_to: Optional[int] = None
    buckets: tuple[int, ...] = ()
    rows: tuple[int, ...] = ()
    pool: Optional[int] = None  # pack mode: anchor blocks per micro-batch
    num_anchors: int = 0        # bucketed: a sample's anchors are min(this, its candidates)

    @classmethod
    def from_config(cls, data: DataConfig, static_shapes: bool,
                    num_anchors: int) -> "BatchShapes":
        if data.batching == "pad":
            return cls(data.micro_batch_size, data.max_length if static_shapes else None)
        buckets = data.resolved_buckets()
        tokens = data.resolved_tokens_per_micro_batch()
        anchors = data.anchors_per_micro_batch
        if data.batching == "pack":
            rows = tuple(tokens // length for length in buckets)
            # Default: the most blocks a bucketed micro-batch of these rows would carry.
            pool = anchors or max(r * min(num_anchors, b) for r, b in zip(rows, buckets))
            if pool < num_anchors:
                raise ValueError(
                    f"data.anchors_per_micro_batch={pool} is not allowed with "
                    f"data.batching=pack: expected >= drafter.num_anchors ({num_anchors}), "
                    f"so that a sample with every anchor fits the pool")
            return cls(data.micro_batch_size, None, buckets, rows, pool, num_anchors)
        rows = tuple(max(1, min(tokens // length,
                                anchors // min(num_anchors, length) if anchors else tokens))
                     for length in buckets)
        return cls(data.micro_batch_size, None, buckets, rows, None, num_anchors)

    @property
    def bucketed(self) -> bool:
        return bool(self.buckets)

    @property
    def packed(self) -> bool:
        return self.pool is not None

    def anchor_counts(self, samples) -> dict[int, int]:
        """Sample id -> the anchors the drafter will draw for it (pack mode's planning)."""
        return {s.sample_id: min(self.num_anchors, valid_anchor_positions(s.loss_mask).numel())
                for s in samples}

    def collate(self, samples: Sequence[Sample], pad_id: int) -> "Batch":
        """A micro-batch in this shape: padded to its width (and, packed or static, to its
        rows: the rows past the samples are empty, and no sample)."""
        lengths = [int(s.input_ids.numel()) for s in samples]
        return collate(samples, pad_id, self.width(lengths), self.row_count(lengths))

    def row_count(self, lengths: Sequence[int]) -> Optional[int]:
        """Rows of a micro-batch of samples of these lengths; None: one per sample."""
        if self.packed:
            return self.rows[self.bucket_of(max(lengths))]
        if not self.bucketed and self.pad_to is not None:
            return self.micro_batch_size
        return None

    def bucket_of(self, length: int) -> int:
        """Index of the smallest bucket that holds ``length`` tokens."""
        i = bisect.bisect_left(self.buckets, length)
        assert i < len(self.buckets), f"a {length}-token sample is beyond every bucket"
        return i

    def width(self, lengths: Sequence[int]) -> Optional[int]:
        """``pad_to`` for a micro-batch of samples of these lengths."""
        if not self.bucketed:
            return self.pad_to
        return self.buckets[self.bucket_of(max(lengths))]

    def max_tokens(self, max_length: int) -> int:
        """Rows x width of the largest micro-batch: what a slot of the feature ring holds."""
        if not self.bucketed:
            return self.micro_batch_size * max_length
        return max(r * b for r, b in zip(self.rows, self.buckets))

    def micro_batches(self, order: Sequence[int], lengths: Mapping[int, int], seed: int,
                      epoch: int, anchors: Optional[Mapping[int, int]] = None
                      ) -> list[list[int]]:
        """One epoch's micro-batches from its sample order (see :func:`bucket_micro_batches`)."""
        if not self.bucketed:
            return micro_batches(order, self.micro_batch_size)
        return bucket_micro_batches(order, lengths, self, seed, epoch, anchors)


def pool_micro_batches(ids: Sequence[int], anchors: Mapping[int, int], rows: int,
                       pool: int) -> list[list[int]]:
    """Consecutive samples of ``ids``, a new micro-batch whenever the next one would exceed
    ``rows`` samples or ``pool`` anchors (no sample is dropped: each has <= pool anchors)."""
    out: list[list[int]] = []
    current: list[int] = []
    used = 0
    for sid in ids:
        if current and (len(current) == rows or used + anchors[sid] > pool):
            out.append(current)
            current, used = [], 0
        current.append(sid)
        used += anchors[sid]
    return out + [current] if current else out


def bucket_micro_batches(order: Sequence[int], lengths: Mapping[int, int], shapes: BatchShapes,
                         seed: int, epoch: int, anchors: Optional[Mapping[int, int]] = None
                         ) -> list[list[int]]:
    """Split ``order`` by bucket, cut each bucket's samples (in order) into micro-batches of its
    row count (packed: of its rows and the anchor pool), then interleave all of them in a
    shuffled order drawn from (seed, epoch).

    Every sample lands in exactly one micro-batch, and the result depends only on (order,
    lengths, anchors, shapes, seed, epoch). Bucketed, only a bucket's last micro-batch may
    have fewer rows, so a bucket gives at most two shapes; packed ones are padded to one.
    """
    per_bucket: list[list[int]] = [[] for _ in shapes.buckets]
    for sid in order:
        per_bucket[shapes.bucket_of(lengths[sid])].append(sid)
    if shapes.packed:
        assert anchors is not None, "packed micro-batches need every sample's anchor count"
        mbs = [mb for ids, rows in zip(per_bucket, shapes.rows)
               for mb in pool_micro_batches(ids, anchors, rows, shapes.pool)]
    else:
        mbs = [mb for ids, rows in zip(per_bucket, shapes.rows)
               for mb in micro_batches(ids, rows)]
    generator = torch.Generator().manual_seed(_generator_seed(seed, epoch, "dflash-buckets"))
    return [mbs[i] for i in torch.randperm(len(mbs), generator=generator).tolist()]


def sample_lengths(samples) -> dict[int, int]:
    """Sample id -> tokens, for an iterable of samples (a ChatDataset)."""
    return {s.sample_id: int(s.input_ids.numel()) for s in samples}


@dataclass
class Batch:
    sample_ids: list[int]
    input_ids: torch.Tensor  # int64 [N, S], right-padded with the pad id
    loss_mask: torch.Tensor  # int64 [N, S], 0 on padding
    lengths: torch.Tensor  # int64 [N], tokens before padding

    @property
    def num_supervised(self) -> int:
        return int(self.loss_mask.sum())


def collate(samples: Sequence[Sample], pad_id: int, pad_to: Optional[int] = None,
            rows: Optional[int] = None) -> Batch:
    """Right-pad samples into one batch; ``pad_to`` fixes S for static shapes (compilation),
    ``rows`` the row count (the rows past the samples are all padding, of length 0)."""
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
    num_rows = len(samples) if rows is None else rows
    if num_rows < len(samples):
        raise ValueError(f"rows={rows} is fewer than the {len(samples)} samples to collate")
    input_ids = torch.full((num_rows, width), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((num_rows, width), dtype=torch.long)
    for row, (sample, n) in enumerate(zip(samples, lengths)):
        input_ids[row, :n] = sample.input_ids
        loss_mask[row, :n] = sample.loss_mask
    lengths += [0] * (num_rows - len(samples))
    return Batch([s.sample_id for s in samples], input_ids, loss_mask,
                 torch.tensor(lengths, dtype=torch.long))
