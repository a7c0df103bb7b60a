"""The GPU's memory, read without a CUDA context in the reading process (a bench's parent stays
alive beside the jobs it launches on the same card), and what counts as a large card."""

from __future__ import annotations

import subprocess
import threading
from typing import Optional

# An 80 GB card (H100) is below it, the H200's 141 GB above: on the H100 (2026-12-05) the 8B
# job's target, drafter and tau evaluator did not fit one card, and the H200's sustained
# decoding rows left prompts outside the kept cache.
LARGE_CARD_GB = 100.0


def _smi_mib(field: str) -> Optional[float]:
    """GPU 0's ``field`` (memory.total, memory.used) in MiB, from nvidia-smi; None without one."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=30)
        return float(out.stdout.split()[0]) if out.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def card_gb() -> float | None:
    """GPU 0's memory in GB, from nvidia-smi; None without one."""
    total = _smi_mib("memory.total")
    return None if total is None else total * 2**20 / 1e9


def used_mib() -> Optional[float]:
    """GPU 0's memory in use by every process (MiB), from nvidia-smi; None without one."""
    return _smi_mib("memory.used")


class GpuMemory:
    """GPU 0's memory in use, sampled every ``period_s`` on a thread while open. Its figures
    are None where nothing could be read (a CPU machine): no figure rather than 0."""

    def __init__(self, period_s: float = 0.5):
        self.period_s = period_s
        self.baseline_mib = used_mib()  # before what the caller starts
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(self.period_s):
            used = used_mib()
            if used is None:
                return
            self.samples.append(used)

    def __enter__(self) -> "GpuMemory":
        if self.baseline_mib is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def peak_mib(self) -> Optional[float]:
        """The most in use at any sample, by every process on the card."""
        return max(self.samples) if self.samples else None

    def peak_added_mib(self) -> Optional[float]:
        """The most in use beyond what was in use at the start: what the caller's work added."""
        peak = self.peak_mib()
        return None if peak is None else round(peak - self.baseline_mib, 1)
