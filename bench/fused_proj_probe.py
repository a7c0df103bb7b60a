"""Would fusing a decoder layer's projections speed up the 8B decode step? Times, at the decode
step's rows, the layer's input projections as the HF modules run them (q, k, v apart; gate and
up apart) against one GEMM each for q|k|v and gate|up, over as many distinct layers as the
model has (so no weight stays in L2 between calls), and says how many outputs of the fused
GEMM equal the separate ones bit for bit (a fused GEMM may take another kernel, and another
reduction order, than the separate ones).

    python -m bench.fused_proj_probe --rows 256,512 --out probe.json
    python -m bench.fused_proj_probe --device cpu --dtype fp32 --layers 2 --rows 4 --hidden 64 \\
        --heads 4 --kv-heads 2 --intermediate 96 --iters 2   # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json

import torch

from bench.decode_common import event_us, write

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def layer_weights(args, device, dtype, generator):
    head_dim = args.hidden // args.heads
    shapes = {"q": args.heads * head_dim, "k": args.kv_heads * head_dim,
              "v": args.kv_heads * head_dim, "gate": args.intermediate, "up": args.intermediate}
    layers = []
    for _ in range(args.layers):
        w = {name: (torch.randn(n, args.hidden, generator=generator, device=device) * 0.02
                    ).to(dtype) for name, n in shapes.items()}
        w["qkv"] = torch.cat([w["q"], w["k"], w["v"]])
        w["gate_up"] = torch.cat([w["gate"], w["up"]])
        layers.append(w)
    return layers


def timed_us(fn, iters: int, device: str) -> float:
    """Microseconds a call of ``fn`` (which runs every layer once) takes; on CUDA replayed as
    a CUDA graph, as the decode step is: no launch cost between the GEMMs."""
    if device.startswith("cuda"):
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # warm-up on the side stream (cuBLAS workspaces) before capture
            with torch.cuda.graph(graph):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        fn = graph.replay
    return event_us(fn, iters, device)


def probe(args, rows: int, layers, device, dtype, generator) -> dict:
    x = torch.randn(rows, args.hidden, generator=generator, device=device).to(dtype)
    linear = torch.nn.functional.linear
    apart = {"qkv": lambda: [(linear(x, w["q"]), linear(x, w["k"]), linear(x, w["v"]))
                             for w in layers],
             "gate_up": lambda: [(linear(x, w["gate"]), linear(x, w["up"])) for w in layers]}
    fused = {"qkv": lambda: [linear(x, w["qkv"]) for w in layers],
             "gate_up": lambda: [linear(x, w["gate_up"]) for w in layers]}
    result = {}
    with torch.no_grad():
        for name in apart:
            a = timed_us(apart[name], args.iters, device) / len(layers)
            f = timed_us(fused[name], args.iters, device) / len(layers)
            separate = torch.cat(apart[name]()[0], dim=-1)
            equal = (fused[name]()[0] == separate).float().mean().item()
            result[name] = {"apart_us": round(a, 2), "fused_us": round(f, 2),
                            "saved_us": round(a - f, 2), "equal_share": equal}
    result["saved_us_per_layer"] = round(sum(r["saved_us"] for r in result.values()), 2)
    result["saved_ms_per_step"] = round(result["saved_us_per_layer"] * args.layers / 1e3, 3)
    return result


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="256,512")
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=12288)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    generator = torch.Generator(device=args.device).manual_seed(0)
    dtype = DTYPES[args.dtype]
    layers = layer_weights(args, args.device, dtype, generator)
    result = {"shape": {k: getattr(args, k) for k in ("layers", "hidden", "heads", "kv_heads",
                                                      "intermediate")},
              "device": (torch.cuda.get_device_name() if args.device.startswith("cuda")
                         else "cpu"), "dtype": args.dtype,
              "rows": {rows: probe(args, rows, layers, args.device, dtype, generator)
                       for rows in map(int, args.rows.split(","))}}
    print(json.dumps(result, indent=1))
    write(args.out, result)
    return result


if __name__ == "__main__":
    main()
