"""The stages and helpers of bench/peers.py: the pipeline, NVIDIA ModelOpt and vLLM Speculators
trained on the same data for the same minutes, each checkpoint decoded by one decoder."""
