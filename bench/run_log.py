"""What a sub-run left: its log in one line, for a summary that must outlive the log, and the
rows of its JSONL files."""

from __future__ import annotations

import json
import re
from pathlib import Path

# An exception's own line ("torch.OutOfMemoryError: CUDA out of memory..."), also behind a
# prefix such as Ray's "(TargetWorker pid=12)".
_EXCEPTION = re.compile(r"\b[\w.]*(Error|Exception|Interrupt)\b: ")


def last_line(path: Path, limit: int = 300) -> str:
    """The last exception line of a run's log, else its last non-blank line (a trailer such
    as Hydra's "Set the environment variable HYDRA_FULL_ERROR=1" says nothing of the cause),
    cut to ``limit`` characters; a progress bar's carriage returns end lines too."""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return "no output"
    raised = [line for line in lines if _EXCEPTION.search(line)]
    return (raised or lines)[-1][:limit]


def jsonl_rows(path: Path) -> list[dict]:
    """The rows of a JSONL file that a run may still be appending to, or was killed while
    writing: a last line without its newline is a row half written, and is left out."""
    if not path.exists():
        return []
    text = path.read_text()
    whole = text if text.endswith("\n") else text[:text.rfind("\n") + 1]
    return [json.loads(line) for line in whole.splitlines() if line.strip()]
