"""A chat JSONL file as encoded training samples, addressed by stable sample ids."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator, Mapping

import torch

from pipeline.data.config import DataConfig
from pipeline.data.encode import Segment, render_segments, tokenize_segments
from pipeline.data.errors import BadLine
from pipeline.data.reader import Conversation, DataError, read_conversations
from pipeline.data.stats import DataStats

log = logging.getLogger(__name__)

# Conversations tokenized per call: the fast tokenizer batches in Rust, memory stays bounded.
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
    """

    def __init__(self, path: str, tokenizer, config: DataConfig, block_size: int) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size={block_size!r} is not allowed: expected an int >= 1")
        self.path = path
        self.min_supervised = 2 * block_size
        self.stats = DataStats()
        self._samples: dict[int, Sample] = {}
        conversations = list(read_conversations(path, config.format, config.on_bad_line,
                                                self.stats, config.max_line_bytes))
        for i in range(0, len(conversations), _ENCODE_CHUNK):
            self._encode(conversations[i:i + _ENCODE_CHUNK], tokenizer, config)
        # Skipped lines are worth a warning: the user asked to skip them, not to hide them.
        level = logging.WARNING if self.stats.skipped_bad else logging.INFO
        log.log(level, "%s: %s%s", path, self.stats.summary(),
                f"; first skipped: {self.stats.bad_examples[0]}" if self.stats.bad_examples
                else "")
        if not self._samples:
            log.warning("%s has no usable sample (need >= %d supervised tokens each): %s",
                        path, self.min_supervised, self.stats.summary())

    def _encode(self, conversations: list[Conversation], tokenizer,
                config: DataConfig) -> None:
        rendered: list[tuple[Conversation, int, Segment]] = []
        for conv in conversations:
            try:
                segments = render_segments(tokenizer, conv.messages, config.enable_thinking)
            except BadLine as e:  # the template refuses a turn or hides it: a bad line
                bad = DataError(self.path, conv.line_index + 1, str(e), e.kind)
                if config.on_bad_line == "error":
                    raise bad from None
                self.stats.record_bad(str(bad), e.kind)
                continue
            self.stats.conversations += 1
            self.stats.split_segments += len(segments) - 1
            rendered += [(conv, k, segment) for k, segment in enumerate(segments)]
        encoded = tokenize_segments(tokenizer, [segment for _, _, segment in rendered])
        for (conv, k, _), (ids, mask) in zip(rendered, encoded):
            if len(ids) > config.max_length:
                self.stats.truncated += 1
                ids, mask = ids[:config.max_length], mask[:config.max_length]
            if sum(mask) < self.min_supervised:
                self.stats.dropped_too_short += 1
                continue
            self.stats.kept += 1
            sid = sample_id(conv.line_index, k)
            self._samples[sid] = Sample(sid, torch.tensor(ids, dtype=torch.long),
                                        torch.tensor(mask, dtype=torch.long))

    @property
    def sample_ids(self) -> list[int]:
        return sorted(self._samples)

    @property
    def samples_by_id(self) -> Mapping[int, Sample]:
        return self._samples

    def __len__(self) -> int:
        return len(self._samples)

    def __getitem__(self, sample_id: int) -> Sample:
        try:
            return self._samples[sample_id]
        except KeyError:
            raise KeyError(f"no sample with id {sample_id} in {self.path} (ids are line "
                           f"indices plus segment * {SEGMENT_STRIDE}; dropped and skipped "
                           f"lines have none)") from None

    def __iter__(self) -> Iterator[Sample]:
        return (self._samples[i] for i in self.sample_ids)
