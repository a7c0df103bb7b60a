"""Helpers of ``python -m bench.quality_real_corpus``: a real target and its drafters (issue 10)."""
