"""The ``triton`` decode attention's kernel alone against the flash kernel's varlen form, per
layer call, at the shapes the regeneration runs, for a grid of launch settings.

    python -m bench.row_kernel --out row_kernel.json                    # CUDA
    TRITON_INTERPRET=1 python -m bench.row_kernel --scale tiny --out /tmp/rk.json   # CPU

No model is loaded: one layer's cache of random bf16 K/V, ``rows`` rows filled to lengths drawn
uniformly from ``--lengths`` (the 8B regeneration's rows hold 128-512 prompt tokens plus up to
256 new ones), and one query per head a row. Each setting of ``row_kernel`` (``BLOCK_N``,
``NUM_WARPS``, ``NUM_STAGES``) is timed over ``--calls`` calls with CUDA events after a
warm-up (its compile), beside ``static_attention``'s varlen call on the same tensors; the
figures are microseconds a call, the filled K/V read per second (against the H200's 4.8 TB/s),
and the largest difference from varlen's output. On CPU (the interpreter, fp32) the settings
run once each and only the differences are meaningful.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from bench.decode_common import event_us

HBM_BYTES_PER_S = 4.8e12  # H200 datasheet
SHAPES = {  # name -> rows, kv heads, query group, head dim
    "qwen3_8b": (512, 8, 4, 128),
    "smollm2_135m": (4096, 3, 3, 64),
}
TINY_SHAPES = {"qwen3_8b": (3, 2, 4, 16), "smollm2_135m": (4, 3, 3, 16)}
GRID = {"BLOCK_N": (32, 64, 128), "NUM_WARPS": (2, 4, 8), "NUM_STAGES": (1, 2, 3)}
TINY_GRID = {"BLOCK_N": (16, 64), "NUM_WARPS": (4,), "NUM_STAGES": (2,)}


def _tensors(rows, kv_heads, group, dim, low, high, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (rows,), generator=g, dtype=torch.int32)
    capacity = -(-high // 16) * 16
    keys = torch.randn(rows, capacity, kv_heads, dim, generator=g).to(device, dtype)
    values = torch.randn(rows, capacity, kv_heads, dim, generator=g).to(device, dtype)
    query = torch.randn(rows, kv_heads * group, 1, dim, generator=g).to(device, dtype)
    return query, keys, values, lengths.to(device)


def measure(shape, lengths, grid: dict, calls: int, device, dtype) -> dict:
    from pipeline.regen import row_kernel
    from pipeline.regen.static_attention import row_attention_triton, row_attention_varlen

    rows, kv_heads, group, dim = shape
    query, keys, values, filled = _tensors(rows, kv_heads, group, dim, *lengths, device, dtype)
    mask = filled.view(-1, 1, 1, 1)
    read = int(filled.sum()) * kv_heads * dim * 2 * keys.element_size()  # K and V, filled only

    def varlen():
        return row_attention_varlen(None, query, keys, values, mask)[0]

    def triton():
        return row_attention_triton(None, query, keys, values, mask)[0]

    want = varlen().float()
    out = {"rows": rows, "kv_heads": kv_heads, "group": group, "head_dim": dim,
           "lengths": list(lengths), "mean_length": float(filled.float().mean()),
           "filled_kv_mb": read / 1e6, "varlen_us": event_us(varlen, calls, device), "settings": []}
    before = {name: getattr(row_kernel, name) for name in grid}
    try:
        for values_ in itertools.product(*grid.values()):
            setting = dict(zip(grid, values_))
            for name, value in setting.items():
                setattr(row_kernel, name, value)
            try:
                diff = float((triton().float() - want).abs().max())
                us = event_us(triton, calls, device)
            except Exception as e:  # a setting that does not fit (shared memory): its figure
                out["settings"].append({**setting, "error": f"{type(e).__name__}: "
                                        f"{(str(e).splitlines() or [''])[0]}"})
                continue
            out["settings"].append({**setting, "us": us, "max_diff_vs_varlen": diff,
                                    "hbm_share": read / (us * 1e-6) / HBM_BYTES_PER_S})
    finally:
        for name, value in before.items():
            setattr(row_kernel, name, value)
    timed = [s for s in out["settings"] if "us" in s]
    if timed:
        best = min(timed, key=lambda s: s["us"])
        default = next((s for s in timed if all(s[k] == before[k] for k in grid)), None)
        out["best"] = best
        out["default_us"] = None if default is None else default["us"]
        out["best_speedup_vs_varlen"] = out["varlen_us"] / best["us"]
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", choices=("h200", "tiny"), default="h200")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    tiny = args.scale == "tiny"
    device = torch.device("cpu" if tiny else "cuda")
    dtype = torch.float32 if tiny else torch.bfloat16
    lengths = {"qwen3_8b": (8, 40) if tiny else (128, 768),
               "smollm2_135m": (8, 40) if tiny else (64, 448)}
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "shapes": {}}
    for name, shape in (TINY_SHAPES if tiny else SHAPES).items():
        result["shapes"][name] = measure(shape, lengths[name], TINY_GRID if tiny else GRID,
                                         args.calls, device, dtype)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({n: {k: v for k, v in s.items() if k != "settings"}
                      for n, s in result["shapes"].items()}, indent=1))
    # The default launch setting is what the regeneration runs: without its figure the run
    # measured nothing it was for, whatever the other settings gave.
    missing = [n for n, s in result["shapes"].items() if s.get("default_us") is None]
    if missing:
        raise SystemExit(f"bench.row_kernel: the default setting gave no figure at "
                         f"{', '.join(missing)} (each setting's error is in {args.out})")
    return result


if __name__ == "__main__":
    main()
