"""What a sub-run's log says in one line, for a summary that must outlive the log."""

from __future__ import annotations

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
