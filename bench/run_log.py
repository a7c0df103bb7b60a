"""What a sub-run's log says in one line, for a summary that must outlive the log."""

from __future__ import annotations

from pathlib import Path


def last_line(path: Path, limit: int = 300) -> str:
    """The last non-blank line of a run's log (an exception's own line, as a rule), cut to
    ``limit`` characters (a progress bar's carriage returns end lines too)."""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    lines = [line for line in lines if line]
    return lines[-1][:limit] if lines else "no output"
