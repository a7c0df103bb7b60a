"""The target alone: forward to the deepest tap on random Qwen3-8B weights, timed."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from pipeline.model.target import load_target

TAPS = (1, 9, 17, 25, 33)


def target_flops(hf: dict, n: int, seq_len: int, layers: int) -> float:
    """2 FLOPs per weight per token through ``layers`` layers, plus causal attention."""
    h, inter = hf["hidden_size"], hf["intermediate_size"]
    nh, nkv, d = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    per_layer = h * nh * d + 2 * h * nkv * d + nh * d * h + 3 * h * inter
    linear = 2 * per_layer * layers * n * seq_len
    attention = 4 * nh * d * (seq_len * (seq_len + 1) / 2) * n * layers
    return float(linear + attention)


@torch.no_grad()
def run_target(path: Path, n: int, seq_len: int, compile: bool, warmup: int = 3,
               steps: int = 10) -> dict:
    from transformers import AutoConfig

    torch.cuda.empty_cache()
    t_load = time.perf_counter()
    target = load_target(path, TAPS, torch.device("cuda"), torch.bfloat16, compile=compile)
    t_load = time.perf_counter() - t_load
    hf = AutoConfig.from_pretrained(path).to_dict()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, hf["vocab_size"], (n, seq_len), generator=g).cuda()
    for _ in range(warmup):
        target(ids)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        target(ids)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    flops = target_flops(hf, n, seq_len, max(TAPS) + 1) * steps
    del target
    torch.cuda.empty_cache()
    return {"n": n, "seq_len": seq_len, "compile": compile, "samples_per_s": n * steps / dt,
            "tflops": flops / dt / 1e12, "load_s": t_load}
