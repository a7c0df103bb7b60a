"""Probe: the compiled prefill at the Qwen3-8B shape, cut to a few layers (random weights,
256 prompts of 128-512 tokens, longest first as the engine orders a wave's refills), timed at
one call of the engine's size (16k padded tokens) and one of 4x; ``--profile`` writes that
call's top kernels. Variants: the attention's grouped heads repeated (the engine's) or handed
to SDPA as groups (``--variant gqa``), symbolic shapes (the engine's) or static
(``--dynamic 0``). On an H100 (2026-12-07) neither moved a call by more than 6%; what did was
the cache write (``RowCache.update``, docs/BENCHMARKS.md).

    python -m bench.probe_prefill --variant repeat --dynamic 1 --layers 4 --profile FILE
    python -m bench.probe_prefill --padding   # CPU: the padded share of the 8B run's prefills
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import pipeline.regen.static_attention as sa
from bench.decode_static import load_model, random_prompts
from bench.decode_step import _filled, prefill_timing
from pipeline.regen.static_decoder import aligned_columns, prefill_group_end


def padded_share(lengths: list[int], rows: int, budget: int, multiple: int) -> float:
    """Padded tokens over prompt tokens when the engine prefills ``lengths`` (longest first,
    ``rows`` prompts a wave, groups of ``budget`` padded tokens) with widths rounded up to
    ``multiple``."""
    ordered = sorted(lengths, reverse=True)
    real = padded = 0
    for at in range(0, len(ordered), rows):
        wave = [[0] * n for n in ordered[at:at + rows]]
        start = 0
        while start < len(wave):
            end, width = prefill_group_end(wave, start, budget)
            padded += (end - start) * aligned_columns(width, multiple)
            real += sum(map(len, wave[start:end]))
            start = end
    return padded / real - 1


def gqa_prefill(query, key, value, scaling):
    return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling,
                                          enable_gqa=key.shape[1] != query.shape[1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--variant", choices=("repeat", "gqa"), default="repeat")
    p.add_argument("--dynamic", type=int, default=1)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--profile", type=Path)
    p.add_argument("--padding", action="store_true",
                   help="print the padded share of 1,024 prompts of 128-512 tokens on 512 rows")
    args = p.parse_args()
    if args.padding:
        lengths = [len(x) for x in random_prompts("128:512", 1024, 2)]
        print(json.dumps({f"rounded_to_{m}": round(padded_share(lengths, 512, 16384, m), 4)
                          for m in (16, 1)}))
        return
    if args.variant == "gqa":
        sa._prefill = gqa_prefill
    if not args.dynamic:
        import pipeline.regen.static_decoder as sd
        sd.compiled_prefill = lambda body: torch.compile(body, backend="inductor",
                                                         dynamic=False, fullgraph=True)
    model, _ = load_model("qwen3_8b_random", "cuda", torch.bfloat16, args.layers)
    prompts = random_prompts("128:512", args.rows, model.config.vocab_size)
    prompts.sort(key=len, reverse=True)  # as the engine orders a wave's refills
    t0 = time.perf_counter()
    with torch.no_grad():
        decoder = _filled(model, prompts, 4, "triton", compile_prefill=True)
        fill_s = time.perf_counter() - t0
        figures = prefill_timing(decoder, prompts, [], args.profile)
    q = torch.zeros(32, 32, 512, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.zeros(32, 8, 512, 128, dtype=torch.bfloat16, device="cuda")
    backends = {}  # which fused kernels take grouped heads as they are (enable_gqa)
    for name in ("flash", "efficient", "cudnn"):
        try:
            params = torch.backends.cuda.SDPAParams(q, k, k, None, 0.0, True, True)
            check = getattr(torch.backends.cuda, f"can_use_{name}_attention")
            backends[name] = bool(check(params, True))
        except Exception as e:  # another signature in another torch: say so
            backends[name] = f"{type(e).__name__}: {e}"
    print(json.dumps({"gqa_backends": backends}))
    print(json.dumps({"variant": args.variant, "dynamic": args.dynamic, "layers": args.layers,
                      "fill_s": round(fill_s, 1), **figures,
                      "gpu": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
