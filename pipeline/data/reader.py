"""Read chat JSONL files in OpenAI ``messages`` or ShareGPT ``conversations`` form.

Every non-blank line is one conversation. A malformed line raises :class:`DataError` naming the
file and the 1-based line number, or, with ``on_bad_line="skip"``, is counted in a
:class:`DataStats` and reported with a log warning. Blank lines give no conversation but are
counted, and count towards line numbers, so a conversation's id (its 0-based line index) never
depends on other lines.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Optional, Union

from pipeline.data.config import DEFAULT_MAX_LINE_BYTES, FORMATS, ON_BAD_LINE
from pipeline.data.errors import BadLine
from pipeline.data.stats import DataStats
from pipeline.checks.validate import require_choice

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {"system": "system", "human": "user", "gpt": "assistant", "tool": "tool",
                  "observation": "tool"}
# Keys kept beside role and content, for templates that read them: the reasoning an assistant
# turn carries apart from its answer, structured tool calls, and which call a tool answers.
OPTIONAL_KEYS = {"reasoning_content": str, "tool_calls": list, "tool_call_id": str, "name": str}
# Which top-level key each format keeps its turns under.
_FORMAT_KEY = {"messages": "messages", "sharegpt": "conversations"}


class DataError(ValueError):
    """A line of a data file that cannot be used; the message says where and why."""

    def __init__(self, path: str, line_no: int, reason: str, kind: str) -> None:
        super().__init__(f"{path}:{line_no}: {reason}")
        self.path = path
        self.line_no = line_no  # 1-based, as editors show it
        self.reason = reason
        self.kind = kind  # one of pipeline.data.errors.KINDS


@dataclass(frozen=True)
class Conversation:
    line_index: int  # 0-based line in the file: the conversation's stable id
    # [{"role": "system"|"user"|"assistant"|"tool", "content": str, + any OPTIONAL_KEYS}]
    messages: list[dict[str, Any]]


def parse_line(line: str, fmt: str = "auto", *,
               require_assistant: bool = True) -> list[dict[str, Any]]:
    """One JSONL line -> messages in OpenAI form. Raises BadLine saying what is wrong.

    ``require_assistant=False`` accepts prompts-only conversations (regeneration answers them).
    """
    require_choice("fmt", fmt, FORMATS)
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        cut = "" if line.endswith("\n") else "; the line has no newline: is the file cut off?"
        raise BadLine("invalid_json", f"invalid JSON ({e.msg} at column {e.colno}){cut}") \
            from None
    if not isinstance(record, dict):
        raise BadLine("not_object", f"expected a JSON object, got {type(record).__name__}")
    fmt = _detect_format(record) if fmt == "auto" else fmt
    key = _FORMAT_KEY[fmt]
    turns = record.get(key)
    if turns is not None and not isinstance(turns, list):
        raise BadLine("wrong_type", f"{key!r} is a {type(turns).__name__}, expected a list of "
                                    f"turns")
    if not turns:
        raise BadLine("no_turns", f"format {fmt!r} needs a non-empty list under {key!r}, "
                                  f"got keys {sorted(record)}")
    if fmt == "messages":
        messages = [_message(t, i, "role", "content", {r: r for r in ROLES})
                    for i, t in enumerate(turns)]
    else:
        messages = [_message(t, i, "from", "value", SHAREGPT_ROLES) for i, t in enumerate(turns)]
    _check_order(messages)
    if require_assistant and not any(m["role"] == "assistant" for m in messages):
        raise BadLine("no_assistant", "no assistant turn: nothing to supervise")
    return messages


def _check_order(messages: list[dict[str, Any]]) -> None:
    """Turn orders no chat has. Repeated user or assistant turns are allowed (some data merges
    or splits turns); what is refused would give the target a context it never saw."""
    previous = None
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "system" and i > 0:
            raise BadLine("role_order", f"turn {i} is a system turn after turn 0; the system "
                                        f"prompt comes first")
        if role == "assistant" and previous in (None, "system"):
            raise BadLine("role_order", f"turn {i} is an assistant turn before any user turn")
        if role == "tool" and previous not in ("assistant", "tool"):
            raise BadLine("role_order", f"turn {i} is a tool result that follows "
                                        f"{previous or 'nothing'}, not an assistant turn")
        previous = role


def _detect_format(record: dict[str, Any]) -> str:
    has = [fmt for fmt, key in _FORMAT_KEY.items() if key in record]
    if len(has) != 1:
        raise BadLine("no_turns", f"expected exactly one of the keys 'messages' (OpenAI) or "
                                  f"'conversations' (ShareGPT), got keys {sorted(record)}")
    return has[0]


def _message(turn: Any, index: int, role_key: str, text_key: str,
             roles: dict[str, str]) -> dict[str, Any]:
    """Check one turn and map its role to the OpenAI name (human -> user, gpt -> assistant)."""
    if not isinstance(turn, dict):
        raise BadLine("bad_turn", f"turn {index} is a {type(turn).__name__}, expected an object")
    if role_key not in turn or text_key not in turn:
        raise BadLine("bad_turn", f"turn {index} needs keys {role_key!r} and {text_key!r}, "
                                  f"got {sorted(turn)}")
    role, text = turn[role_key], turn[text_key]
    if text is None and turn.get("tool_calls"):  # OpenAI form: a pure tool call has no text
        text = ""
    if not isinstance(role, str):
        raise BadLine("wrong_type", f"turn {index} has a non-string {role_key!r} "
                                    f"({type(role).__name__})")
    if role not in roles:
        raise BadLine("bad_role", f"turn {index} has {role_key}={role!r}; "
                                  f"allowed: {sorted(roles)}")
    if not isinstance(text, str):
        raise BadLine("wrong_type", f"turn {index} has a non-string {text_key!r} "
                                    f"({type(text).__name__})")
    message = {"role": roles[role], "content": text}
    for key, kind in OPTIONAL_KEYS.items():
        if turn.get(key) is None:
            continue
        if not isinstance(turn[key], kind):
            raise BadLine("wrong_type", f"turn {index} has a {type(turn[key]).__name__} "
                                        f"{key!r}, expected a {kind.__name__}")
        message[key] = turn[key]
    return message


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadLine("not_utf8", f"not UTF-8 ({e.reason} at byte {e.start})") from None


def read_conversations(path: str, fmt: str = "auto", on_bad_line: str = "error",
                       stats: Optional[DataStats] = None,
                       max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, *,
                       warn_skipped: bool = True,
                       require_assistant: bool = True) -> Iterator[Conversation]:
    """Yield the conversations of a JSONL file in line order.

    ``stats`` (if given) counts lines read, blank lines and bad lines skipped, by kind;
    skipped lines are also reported in one warning when the file has been read to the end,
    unless ``warn_skipped`` is false (a caller that reports them itself, with what it finds
    later, so each bad line is reported once). No line longer than ``max_line_bytes`` is held
    in memory: the rest of it is read past and the line is bad.
    """
    require_choice("fmt", fmt, FORMATS)
    require_choice("on_bad_line", on_bad_line, ON_BAD_LINE)
    stats = stats if stats is not None else DataStats()
    skipped_before = stats.skipped_bad
    # Bytes, decoded per line: one badly encoded line is a bad line, not a failed file.
    with open(path, "rb") as f:
        for index, raw in enumerate(_lines(f, max_line_bytes)):
            if isinstance(raw, bytes) and not raw.strip():
                stats.blank += 1
                continue
            stats.lines_read += 1
            try:
                if isinstance(raw, int):
                    raise BadLine("too_long", f"line of {raw} bytes, over "
                                              f"data.max_line_bytes={max_line_bytes}")
                messages = parse_line(_decode(raw), fmt, require_assistant=require_assistant)
            except BadLine as e:
                bad = DataError(path, index + 1, str(e), e.kind)
                if on_bad_line == "error":
                    raise bad from None
                stats.record_bad(str(bad), e.kind)
                continue
            yield Conversation(index, messages)
    skipped = stats.skipped_bad - skipped_before
    if skipped and warn_skipped:
        log.warning("skipped %d malformed line(s) of %s (on_bad_line=skip): %s; first: %s",
                    skipped, path, stats.kinds_summary(), "; ".join(stats.bad_examples[:3]))


def _lines(f: BinaryIO, max_bytes: int) -> Iterator[Union[bytes, int]]:
    """Each line of ``f`` as bytes, or, for a line over ``max_bytes``, its length: it is read
    past in bounded chunks, never held whole."""
    while True:
        line = f.readline(max_bytes + 1)
        if not line:
            return
        if len(line) <= max_bytes or line.endswith(b"\n") and len(line) == max_bytes + 1:
            yield line
            continue
        size = len(line)
        while not line.endswith(b"\n"):
            line = f.readline(1 << 20)
            if not line:
                break
            size += len(line)
        yield size - line.endswith(b"\n")  # bytes of the line itself
