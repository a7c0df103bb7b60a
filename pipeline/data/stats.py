"""Counts of what happened to every line of a data file, so nothing is dropped silently."""

from __future__ import annotations

from dataclasses import dataclass, field

# How many reasons for skipped lines are kept verbatim (the rest are only counted).
MAX_BAD_EXAMPLES = 5


@dataclass
class DataStats:
    lines_read: int = 0         # non-blank lines
    kept: int = 0               # samples (one per line, or per segment of a split line)
    dropped_too_short: int = 0  # fewer supervised tokens than the drafter needs
    skipped_bad: int = 0        # malformed lines, with on_bad_line="skip"
    truncated: int = 0          # kept or dropped samples that were cut to max_length
    # Extra samples from conversations whose chat template rewrites earlier turns (Qwen3
    # drops old reasoning): each such line gives one sample per sequence the target saw.
    split_segments: int = 0
    bad_examples: list[str] = field(default_factory=list)

    def record_bad(self, reason: str) -> None:
        self.skipped_bad += 1
        if len(self.bad_examples) < MAX_BAD_EXAMPLES:
            self.bad_examples.append(reason)

    def summary(self) -> str:
        return (f"lines={self.lines_read} kept={self.kept} "
                f"dropped_too_short={self.dropped_too_short} skipped_bad={self.skipped_bad} "
                f"truncated={self.truncated} split_segments={self.split_segments}")
