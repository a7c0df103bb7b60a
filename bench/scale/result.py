"""A bench's JSON file of figures, which parts run in separate GPU calls add to."""

from __future__ import annotations

import json
import time
from pathlib import Path


def open_result(out: Path, work: Path, name: str) -> tuple[Path, dict]:
    """``<out>/<name>`` and the figures it holds so far, stamped with this machine, the date
    and torch; ``out`` and ``work`` (the large files) are created."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    path = out / name
    result = json.loads(path.read_text()) if path.exists() else {}
    result.update(machine=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                  date=time.strftime("%Y-%m-%d"), torch=torch.__version__)
    return path, result


def record(result: dict, path: Path, key: str, value) -> None:
    """Add one figure to ``result``, print it, and write the whole file again (a part cut off
    by its call's time limit keeps the figures it reached)."""
    result[key] = value
    print(f"[bench] {key}: {json.dumps(value)}", flush=True)
    path.write_text(json.dumps(result, indent=2))


def failed_parts(result: dict) -> list[str]:
    """The parts whose run failed (their figures are absent, not zero)."""
    return [k for k, v in result.items() if isinstance(v, dict) and "error" in v]
