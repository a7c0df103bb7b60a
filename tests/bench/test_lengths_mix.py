"""The benchmark's length mix follows the distribution it states."""

import math
import statistics

import pytest

from bench.scale import lengths_mix


def test_lognormal_fit_has_the_published_median_and_mean():
    mu, sigma = lengths_mix.lognormal_params()
    assert math.exp(mu) == pytest.approx(393) and round(sigma, 2) == 0.77
    assert math.exp(mu + sigma ** 2 / 2) == pytest.approx(528)


def test_sampled_lengths_are_clipped_and_near_the_figures():
    lengths = lengths_mix.sample_lengths(20000)
    assert min(lengths) >= 64 and max(lengths) <= 3072
    assert abs(statistics.median(lengths) - 393) < 15
    assert abs(statistics.fmean(lengths) - 528) < 20  # the clip moves the mean a little
    assert lengths == lengths_mix.sample_lengths(20000)  # seeded
