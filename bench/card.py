"""The GPU's memory, read without a CUDA context in the reading process (a bench's parent stays
alive beside the jobs it launches on the same card), and what counts as a large card."""

from __future__ import annotations

import subprocess

# An 80 GB card (H100) is below it, the H200's 141 GB above: on the H100 (2026-12-05) the 8B
# job's target, drafter and tau evaluator did not fit one card, and the H200's sustained
# decoding rows left prompts outside the kept cache.
LARGE_CARD_GB = 100.0


def card_gb() -> float | None:
    """GPU 0's memory in GB, from nvidia-smi; None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=30)
        return float(out.stdout.split()[0]) * 2**20 / 1e9 if out.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None
