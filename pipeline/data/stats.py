"""Counts of what happened to every line of a data file, so nothing is dropped silently.

Every line of a file is one of: blank, bad (skipped, with ``on_bad_line=skip``), or a
conversation; so ``lines == blank + skipped_bad + conversations`` once a ChatDataset has read
the file, and the summary spells that sum out. Conversations then give samples (one per line,
or one per segment of a line the template splits), each kept or dropped as too short.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# How many reasons for skipped lines are kept verbatim (the rest are only counted).
MAX_BAD_EXAMPLES = 5


@dataclass
class DataStats:
    lines_read: int = 0         # non-blank lines (conversations + skipped_bad)
    blank: int = 0              # empty or whitespace-only lines: no conversation, no id used
    conversations: int = 0      # lines that read and rendered: each gives >= 1 sample
    kept: int = 0               # samples (one per line, or per segment of a split line)
    dropped_too_short: int = 0  # fewer supervised tokens than the drafter needs
    skipped_bad: int = 0        # malformed lines, with on_bad_line="skip"
    truncated: int = 0          # kept or dropped samples that were cut to max_length
    # Extra samples from conversations whose chat template rewrites earlier turns (Qwen3
    # drops old reasoning): each such line gives one sample per sequence the target saw.
    split_segments: int = 0
    bad_examples: list[str] = field(default_factory=list)
    # Skipped lines by kind (pipeline.data.errors.KINDS); the counts sum to skipped_bad.
    bad_by_kind: dict[str, int] = field(default_factory=dict)

    @property
    def lines(self) -> int:
        """Every line of the file read so far, blank ones included."""
        return self.lines_read + self.blank

    def record_bad(self, reason: str, kind: str) -> None:
        self.skipped_bad += 1
        self.bad_by_kind[kind] = self.bad_by_kind.get(kind, 0) + 1
        if len(self.bad_examples) < MAX_BAD_EXAMPLES:
            self.bad_examples.append(reason)

    def kinds_summary(self) -> str:
        return " ".join(f"{k}={n}" for k, n in sorted(self.bad_by_kind.items())) or "none"

    def summary(self) -> str:
        """One line: how the file's lines divide, then what became of the samples."""
        return (f"lines={self.lines} = conversations={self.conversations} + "
                f"skipped_bad={self.skipped_bad} + blank={self.blank}; "
                f"samples kept={self.kept} dropped_too_short={self.dropped_too_short} "
                f"truncated={self.truncated} split_segments={self.split_segments}"
                + (f"; bad: {self.kinds_summary()}" if self.skipped_bad else ""))

    def skipped_report(self, path: str) -> list[str]:
        """The skipped lines of ``path`` for the log, each once: the first few as
        ``file:line: reason``, then how many more there are (the summary counts them)."""
        more = self.skipped_bad - len(self.bad_examples)
        return ([f"skipped {example}" for example in self.bad_examples]
                + ([f"{path}: {more} more skipped line(s) not shown (data.on_bad_line=skip)"]
                   if more else []))
