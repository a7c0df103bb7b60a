"""The ``data`` config group: where the chat data lives and how it becomes training samples."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.validate import require, require_choice

FORMATS = ("auto", "messages", "sharegpt")
ON_BAD_LINE = ("error", "skip")
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
        # bool is an int subclass; True as a length is a mistake, not a 1.
        for key, low in (("max_length", 2), ("micro_batch_size", 1), ("seed", 0),
                         ("max_line_bytes", 2)):
            value = getattr(self, key)
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
            require(ok, f"data.{key}", value, f"an integer >= {low}")
