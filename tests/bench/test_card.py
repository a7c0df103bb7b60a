"""bench/card.py's GPU memory sampler, with nvidia-smi's reading replaced."""

import itertools
import time

from bench import card


def test_peaks_are_the_highest_sample_and_what_it_adds_to_the_start(monkeypatch):
    readings = itertools.chain([1000.0, 1500.0, 3000.0, 2000.0], itertools.repeat(2000.0))
    monkeypatch.setattr(card, "used_mib", lambda: next(readings))
    with card.GpuMemory(period_s=0.001) as memory:
        while len(memory.samples) < 4:
            time.sleep(0.001)
    assert memory.baseline_mib == 1000.0
    assert memory.samples[:3] == [1500.0, 3000.0, 2000.0]
    assert memory.peak_mib() == 3000.0 and memory.peak_added_mib() == 2000.0


def test_without_a_gpu_there_is_no_figure(monkeypatch):
    monkeypatch.setattr(card, "used_mib", lambda: None)
    with card.GpuMemory(period_s=0.001) as memory:
        pass
    assert memory.samples == [] and memory.peak_mib() is None
    assert memory.peak_added_mib() is None
