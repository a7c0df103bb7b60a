"""The ``data`` config group: where the chat data lives and how it becomes training samples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pipeline.checks.validate import require, require_choice

FORMATS = ("auto", "messages", "sharegpt")
ON_BAD_LINE = ("error", "skip")
BATCHING = ("pad", "bucket", "pack")
# At most 2 compiled shapes per bucket (its full micro-batch and its epoch-tail one), so this
# bounds the shapes a compiled drafter sees; its recompile limit is raised to match.
MAX_BUCKETS = 8
# 4 MiB: some 25 times a 32k-token conversation. Longer lines are damage (a binary blob, a
# file without newlines), and one would take minutes to tokenize before being cut anyway.
DEFAULT_MAX_LINE_BYTES = 4 << 20


@dataclass
class DataConfig:
    # JSONL chat files. "builtin:tiny" names the embedded demo data (see pipeline.assets), which
    # the driver resolves to a real path before the data code sees it.
    train_path: str = "builtin:tiny"
    heldout_path: str = "builtin:tiny"
    # Line format: "messages" (OpenAI), "sharegpt" ("conversations"), or "auto" (per line).
    format: str = "auto"  # one of FORMATS
    # Tokens per sample after the chat template; longer samples are truncated (and counted).
    max_length: int = 512
    # A malformed line stops the job ("error") or is counted, reported and left out ("skip").
    on_bad_line: str = "error"  # one of ON_BAD_LINE
    # A line longer than this is a bad line (kind too_long), and is never read whole.
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    micro_batch_size: int = 4
    # How micro-batches are shaped. "pad": micro_batch_size samples each, padded to max_length
    # (drafter.static_shapes) or to the longest one. "bucket": every sample goes to the smallest
    # of ``buckets`` that holds it; a micro-batch holds samples of one bucket only, padded to
    # that bucket's length, as many rows as ``tokens_per_micro_batch`` // length allows (and
    # ``anchors_per_micro_batch`` // min(drafter.num_anchors, length), if set). "pack": the
    # buckets' rows for the target, but a micro-batch takes samples of its bucket until their
    # anchors fill ``anchors_per_micro_batch`` (or its rows ``tokens_per_micro_batch``), and
    # the drafter runs all its rows as one sequence with one pool of anchor blocks
    # (pipeline/objective/packing.py): no block is spent on padding, and one drafter shape.
    batching: str = "pad"  # one of BATCHING
    # Sorted bucket lengths, the last one max_length; null: the three powers of two below
    # max_length, then max_length (3072 -> [512, 1024, 2048, 3072]).
    buckets: Optional[list[int]] = None
    # Token budget of one bucketed micro-batch (rows x bucket length); null:
    # micro_batch_size * max_length, so the longest bucket holds micro_batch_size rows.
    tokens_per_micro_batch: Optional[int] = None
    # Budget of anchor blocks of one bucketed micro-batch (rows x min(num_anchors, length));
    # null: no budget. The drafter's memory grows with its blocks, not its tokens: 12 rows of
    # 512 tokens hold 6x the blocks of 2 rows of 3072 at 512 anchors. With batching=pack, the
    # drafter's pool of anchor blocks; null: the most blocks a bucketed micro-batch would
    # carry (max over buckets of rows x min(num_anchors, length)).
    anchors_per_micro_batch: Optional[int] = None
    # Passed to the chat template in regeneration, training and eval alike. True (Qwen3's own
    # default): the target may reason, and the drafter trains on everything the target writes,
    # reasoning included, since speculative decoding serves those tokens too. False: Qwen3's
    # template puts an empty <think></think> into the prompt, the target answers directly, and
    # that is what the drafter learns. Templates without the option ignore it.
    enable_thinking: bool = True
    # Seeds the per-epoch sample order.
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("train_path", "heldout_path"):
            value = getattr(self, key)
            require(isinstance(value, str) and bool(value), f"data.{key}", value,
                    "a JSONL file path or builtin:tiny")
        require_choice("data.format", self.format, FORMATS)
        require_choice("data.on_bad_line", self.on_bad_line, ON_BAD_LINE)
        require(isinstance(self.enable_thinking, bool), "data.enable_thinking",
                self.enable_thinking, "true or false")
        for key, low in (("max_length", 2), ("micro_batch_size", 1), ("seed", 0),
                         ("max_line_bytes", 2)):
            require(_is_int(getattr(self, key), low), f"data.{key}", getattr(self, key),
                    f"an integer >= {low}")
        require_choice("data.batching", self.batching, BATCHING)
        self._check_buckets()

    def _check_buckets(self) -> None:
        if self.buckets is not None:
            self.buckets = list(self.buckets)  # a ListConfig from Hydra becomes a plain list
            b = self.buckets
            ok = (0 < len(b) <= MAX_BUCKETS and all(_is_int(x, 2) for x in b)
                  and all(x < y for x, y in zip(b, b[1:])) and b[-1] == self.max_length)
            require(ok, "data.buckets", self.buckets,
                    f"null or 1 to {MAX_BUCKETS} increasing integers >= 2 ending at "
                    f"data.max_length ({self.max_length})")
        tokens = self.tokens_per_micro_batch
        require(tokens is None or _is_int(tokens, self.max_length),
                "data.tokens_per_micro_batch", tokens,
                f"null or an integer >= data.max_length ({self.max_length}), so that a "
                f"micro-batch of the longest bucket holds a row")
        anchors = self.anchors_per_micro_batch
        require(anchors is None or _is_int(anchors, 1), "data.anchors_per_micro_batch",
                anchors, "null or an integer >= 1")

    def resolved_buckets(self) -> tuple[int, ...]:
        if self.buckets is not None:
            return tuple(self.buckets)
        powers = [1 << k for k in range(1, self.max_length.bit_length() + 1)
                  if (1 << k) < self.max_length]
        return (*powers[-3:], self.max_length)

    def resolved_tokens_per_micro_batch(self) -> int:
        if self.tokens_per_micro_batch is not None:
            return self.tokens_per_micro_batch
        return self.micro_batch_size * self.max_length


def _is_int(value, low: int) -> bool:
    # bool is an int subclass; True as a length is a mistake, not a 1.
    return isinstance(value, int) and not isinstance(value, bool) and value >= low
