"""Why a data line is bad: a short kind for counting, and a sentence for the person fixing it.

Every bad line is reported as ``file:line: reason``; with ``data.on_bad_line=skip`` it is also
counted under its kind (``DataStats.bad_by_kind``), so the counts of a run add up to the lines
it read and the summary says what kind of damage a file has.
"""

from __future__ import annotations

# The kinds, in the order a line is checked.
KINDS = (
    "too_long",      # over data.max_line_bytes (read no further than that)
    "not_utf8",      # bytes that are not UTF-8
    "invalid_json",  # not JSON: a cut-off line, a stray character
    "not_object",    # JSON, but not an object
    "no_turns",      # no 'messages' / 'conversations' list, or an empty one
    "bad_turn",      # a turn that is not an object or lacks its keys
    "bad_role",      # a role the format does not know
    "wrong_type",    # a field of the wrong JSON type
    "role_order",    # turns in an order no chat has (a system turn late, a tool answer first)
    "no_assistant",  # nothing to supervise
    "template",      # the chat template refuses the conversation or hides an answer
)


class BadLine(ValueError):
    """What is wrong with one line, without where: the reader adds file and line."""

    def __init__(self, kind: str, reason: str) -> None:
        assert kind in KINDS, f"unknown bad-line kind {kind!r}"
        super().__init__(reason)
        self.kind = kind
