"""A synthetic chat set whose sample lengths follow a published distribution.

Source: Nemotron v1 chat (NVIDIA's Llama-Nemotron post-training set, chat split), median 393
and mean 528 tokens per sample, as quoted in issue 17. A log-normal with that median and mean
has mu = ln(393) and sigma = sqrt(2 ln(528 / 393)) ~= 0.769 (the mean of a log-normal is
exp(mu + sigma^2 / 2)). Lengths are clipped to [64, 3072] (the preset's max_length).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

from bench.scale.synthetic import _words

MEDIAN, MEAN = 393, 528
LOW, HIGH = 64, 3072
SOURCE = ("Nemotron v1 chat (Llama-Nemotron post-training dataset v1, chat split): median 393, "
          "mean 528 tokens per sample, as quoted in issue 17")


def lognormal_params(median: float = MEDIAN, mean: float = MEAN) -> tuple[float, float]:
    return math.log(median), math.sqrt(2 * math.log(mean / median))


def distribution(scale: float = 1.0) -> dict:
    """The distribution as recorded in the benchmark's JSON (``scale`` shrinks it for --tiny)."""
    mu, sigma = lognormal_params()
    return {"source": SOURCE, "family": "log-normal", "mu": mu + math.log(scale),
            "sigma": sigma, "median_tokens": MEDIAN * scale, "mean_tokens": MEAN * scale,
            "clip": [round(LOW * scale), round(HIGH * scale)]}


def sample_lengths(count: int, scale: float = 1.0, seed: int = 0) -> list[int]:
    """``count`` token lengths from the log-normal, clipped (both scaled by ``scale``)."""
    mu, sigma = lognormal_params()
    rng = random.Random(seed)
    lo, hi = round(LOW * scale), round(HIGH * scale)
    return [min(hi, max(lo, round(rng.lognormvariate(mu, sigma) * scale)))
            for _ in range(count)]


def write_mix(path: Path, lengths: list[int], tokens_per_word: float) -> Path:
    """One chat per length: a quarter of it the user turn, the rest the assistant's answer."""
    rng = random.Random(1)
    words = _words()
    with path.open("w") as f:
        for n in lengths:
            n_words = max(8, round(n / tokens_per_word))
            prompt = max(2, n_words // 4)
            user = " ".join(rng.choice(words) for _ in range(prompt))
            answer = " ".join(rng.choice(words) for _ in range(n_words - prompt))
            f.write(json.dumps({"messages": [{"role": "user", "content": user},
                                             {"role": "assistant", "content": answer}]}) + "\n")
    return path


def tokens_per_word(tokenizer) -> float:
    text = " ".join(_words()[:200])
    return len(tokenizer(text, add_special_tokens=False)["input_ids"]) / 200


def summarize(lengths: list[int]) -> dict:
    s = sorted(lengths)
    return {"samples": len(s), "mean": statistics.fmean(s), "median": statistics.median(s),
            "p10": s[len(s) // 10], "p90": s[9 * len(s) // 10], "min": s[0], "max": s[-1]}
