"""Fast greedy decoding for data regeneration: continuous batching on a static KV cache."""

from pipeline.decode.static_decoder import greedy_decode

__all__ = ["greedy_decode"]
