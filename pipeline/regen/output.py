"""The output file: one JSON record per regenerated conversation, resumable after a crash.

Records are written whole and flushed batch by batch, in input order, so after a crash the
file is a prefix of the full output, possibly followed by one half-written line. On restart
:func:`resume_output` keeps the complete lines, cuts the partial one off, and says which
input lines they came from and what from (their fingerprints, pipeline/regen/fingerprint.py),
for the driver to check and skip.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, NamedTuple, Optional

from pipeline.regen.fingerprint import KEY as FINGERPRINT
from pipeline.regen.messages import GenResult

log = logging.getLogger(__name__)


class Done(NamedTuple):
    """A complete record of an earlier run."""

    source_line: int
    fingerprint: Optional[dict[str, Any]]  # None: written before records carried one


def to_record(result: GenResult, fingerprint: dict[str, Any]) -> dict:
    """OpenAI ``messages`` form, the input line it came from, per-turn generation facts, and
    what it was made from (the training reader reads ``messages`` and ignores the rest)."""
    return {
        "messages": [dict(m) for m in result.messages],
        "source_line": result.line_index,  # 0-based, as Conversation.line_index
        "regen": {"num_tokens": [t.num_tokens for t in result.turns],
                  "finished": [t.finished for t in result.turns],
                  "round_trips": [t.round_trips for t in result.turns]},
        FINGERPRINT: fingerprint,
    }


def format_record(result: GenResult, fingerprint: dict[str, Any]) -> str:
    return json.dumps(to_record(result, fingerprint), ensure_ascii=False) + "\n"


def resume_output(path: str) -> list[Done]:
    """Every complete record of ``path`` (none if it does not exist).

    A last line without its newline is a write cut short by a crash: it is truncated away so
    that appending starts on a fresh line. A complete line that is not a record means the
    file is not ours (or was edited), and is an error naming it.
    """
    if not os.path.exists(path):
        return []
    done, keep, size = [], 0, os.path.getsize(path)
    # Streamed in binary: split on b"\n" only (str.splitlines would also split at U+2028,
    # which ensure_ascii=False leaves raw inside strings), and big files never load whole.
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break  # the partial last line
            done.append(_done(path, len(done) + 1, raw))
            keep += len(raw)
    # Checked before anything is cut: a file that is not ours is left exactly as it was.
    if keep < size:
        log.warning("%s: cutting off a partial last line (%d bytes) left by an interrupted run",
                    path, size - keep)
        with open(path, "r+b") as f:
            f.truncate(keep)
    return done


def _done(path: str, line_no: int, raw: bytes) -> Done:
    try:
        record = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}:{line_no}: not a JSON record ({e}); --output must be "
                         f"a file this tool wrote, or a new path") from None
    value = record.get("source_line") if isinstance(record, dict) else None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{path}:{line_no}: no integer 'source_line'; --output must be a "
                         f"file this tool wrote, or a new path")
    fingerprint = record.get(FINGERPRINT)
    return Done(value, fingerprint if isinstance(fingerprint, dict) else None)
