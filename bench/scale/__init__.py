"""Pieces of the Qwen3-8B-scale benchmark (bench/h200_qwen3_8b.py)."""
