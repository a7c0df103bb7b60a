"""bench.pin_probe: the stall figure from the loop's steps, the plumbing on CPU, and pinned
ways refused on CPU in one line."""

import pytest

from bench.pin_probe import child, excess, main


def test_excess_sums_what_the_overlapping_steps_took_over_the_median():
    steps = [(0.0, 1.0), (1.0, 2.0), (2.0, 4.5), (4.5, 5.5), (5.5, 6.5)]
    # The window (1.5, 4.8) overlaps the 2nd, 3rd and 4th steps: only the 3rd ran long.
    total, longest, n = excess(steps, (1.5, 4.8), median=1.0)
    assert (total, longest, n) == (1.5, 2.5, 3)
    assert excess(steps, (10.0, 11.0), median=1.0) == (0.0, 0.0, 0)


@pytest.mark.parametrize("loop", [False, True])
def test_the_pageable_way_runs_on_cpu_with_and_without_the_loop(loop):
    got = child("pageable", loop, gb=0.004, count=4, device="cpu")
    assert got["way"] == "pageable" and got["pin_s"] >= 0
    if loop:
        # How many steps overlap the pinning is the machine's timing: 4 MB of pageable memory
        # may be allocated between two steps (none overlaps, and none ran long).
        assert got["median_step_ms"] > 0 and got["steps_beside"] >= 0 and got["excess_s"] >= 0
        assert (got["steps_beside"] == 0) == (got["longest_step_ms"] == 0)
    else:
        assert "excess_s" not in got


def test_pinned_ways_are_refused_on_cpu_in_one_line():
    with pytest.raises(SystemExit, match="--ways alloc: allowed .*pinning needs CUDA"):
        main(["--device", "cpu", "--ways", "alloc"])
    with pytest.raises(SystemExit, match="--ways nope: allowed"):
        main(["--ways", "nope"])
