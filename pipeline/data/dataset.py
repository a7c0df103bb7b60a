"""A chat JSONL file as encoded training samples, addressed by stable sample ids."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from pipeline.data.config import DataConfig
from pipeline.data.encode import Segment, render_segments, tokenize_segments
from pipeline.data.errors import BadLine
from pipeline.data.reader import Conversation, DataError, read_conversations
from pipeline.data.stats import DataStats

log = logging.getLogger(__name__)

# Segments tokenized per call: the fast tokenizer batches in Rust, memory stays bounded.
_ENCODE_CHUNK = 256
# A conversation the chat template splits into several sequences (see pipeline.data.encode)
# gives one sample per segment: id = segment * SEGMENT_STRIDE + line index. Segment 0 keeps
# the plain line index, so single-sequence data keeps the ids it always had.
SEGMENT_STRIDE = 1 << 32


def sample_id(line_index: int, segment: int) -> int:
    if not 0 <= line_index < SEGMENT_STRIDE:
        raise ValueError(f"line index {line_index} is beyond the {SEGMENT_STRIDE} lines a data "
                         f"file may have")
    return segment * SEGMENT_STRIDE + line_index


@dataclass(frozen=True)
class Sample:
    sample_id: int  # the 0-based line index in the data file (+ segment * SEGMENT_STRIDE)
    input_ids: torch.Tensor  # int64 [S]
    loss_mask: torch.Tensor  # int64 [S], 1 where the token is supervised

    @property
    def num_supervised(self) -> int:
        return int(self.loss_mask.sum())


class ChatDataset:
    """Reads and encodes a whole JSONL file up front; ``dataset[sample_id]`` is a Sample.

    The chat template is applied with ``config.enable_thinking``, as in regeneration and eval.
    A sample needs at least ``2 * block_size`` supervised tokens (a drafter block needs an
    anchor and the tokens after it); shorter ones are dropped and counted in ``stats``. A
    sample's id is its line index (see :func:`sample_id` for conversations the template
    splits into several sequences), so dropping or skipping lines never renumbers the others.

    Lines are read, checked and rendered in file order, so with ``on_bad_line="error"`` the
    first bad line of the file stops it, whatever its kind. The samples are held end to end in
    two flat arrays (int32 tokens, uint8 mask): small, and quick to pickle, which is how the
    driver hands an encoded data set to the prefetcher instead of having it encode again.
    """

    def __init__(self, path: str, tokenizer, config: DataConfig, block_size: int) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size={block_size!r} is not allowed: expected an int >= 1")
        self.path = path
        self.min_supervised = 2 * block_size
        self.stats = DataStats()
        self._rows: dict[int, int] = {}  # sample id -> its row in _starts
        ids: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        pending: list[tuple[int, Segment]] = []  # (sample id, segment) not yet tokenized
        for conv in read_conversations(path, config.format, config.on_bad_line, self.stats,
                                       config.max_line_bytes, warn_skipped=False):
            pending += self._render(conv, tokenizer, config)
            if len(pending) >= _ENCODE_CHUNK:
                self._encode(pending, tokenizer, config.max_length, ids, masks)
                pending = []
        self._encode(pending, tokenizer, config.max_length, ids, masks)
        self._ids = np.concatenate(ids) if ids else np.zeros(0, np.int32)
        self._mask = np.concatenate(masks) if masks else np.zeros(0, np.uint8)
        self._starts = np.cumsum([0] + [len(x) for x in ids], dtype=np.int64)
        self._sorted_ids = sorted(self._rows)
        self._report()

    def _render(self, conv: Conversation, tokenizer,
                config: DataConfig) -> list[tuple[int, Segment]]:
        try:
            segments = render_segments(tokenizer, conv.messages, config.enable_thinking)
        except BadLine as e:  # the template refuses a turn or hides it: a bad line
            bad = DataError(self.path, conv.line_index + 1, str(e), e.kind)
            if config.on_bad_line == "error":
                raise bad from None
            self.stats.record_bad(str(bad), e.kind)
            return []
        self.stats.conversations += 1
        self.stats.split_segments += len(segments) - 1
        return [(sample_id(conv.line_index, k), segment) for k, segment in enumerate(segments)]

    def _encode(self, rendered: list[tuple[int, Segment]], tokenizer, max_length: int,
                ids_out: list[np.ndarray], masks_out: list[np.ndarray]) -> None:
        encoded = tokenize_segments(tokenizer, [segment for _, segment in rendered])
        for (sid, _), (ids, mask) in zip(rendered, encoded):
            if len(ids) > max_length:
                self.stats.truncated += 1
                ids, mask = ids[:max_length], mask[:max_length]
            if sum(mask) < self.min_supervised:
                self.stats.dropped_too_short += 1
                continue
            self.stats.kept += 1
            self._rows[sid] = len(ids_out)
            ids_out.append(np.asarray(ids, dtype=np.int32))
            masks_out.append(np.asarray(mask, dtype=np.uint8))

    def _report(self) -> None:
        """Each skipped line once (a few verbatim, the rest counted), then the counts: a
        warning when lines were skipped (the user asked to skip them, not to hide them)."""
        for line in self.stats.skipped_report(self.path):
            log.warning("%s", line)
        level = logging.WARNING if self.stats.skipped_bad else logging.INFO
        log.log(level, "%s: %s", self.path, self.stats.summary())

    @property
    def sample_ids(self) -> list[int]:
        return list(self._sorted_ids)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, sample_id: int) -> Sample:
        try:
            row = self._rows[sample_id]
        except KeyError:
            raise KeyError(f"no sample with id {sample_id} in {self.path} (ids are line "
                           f"indices plus segment * {SEGMENT_STRIDE}; dropped and skipped "
                           f"lines have none)") from None
        start, end = self._starts[row], self._starts[row + 1]
        # A copy in int64: the arrays may be read-only views of Ray's object store.
        return Sample(sample_id, torch.from_numpy(self._ids[start:end].astype(np.int64)),
                      torch.from_numpy(self._mask[start:end].astype(np.int64)))

    def __iter__(self) -> Iterator[Sample]:
        return (self[i] for i in self._sorted_ids)
