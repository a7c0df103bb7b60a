"""What pinning a checkpoint's worth of host memory costs a GPU loop running beside it:

    python -m bench.pin_probe --out $OUT/pin.json                 # 12.6 GB, every way, on CUDA
    python -m bench.pin_probe --device cpu --gb 0.05 --ways pageable   # the plumbing, on CPU

In the 8B job (docs/BENCHMARKS.md, 2026-12-06, day 19) the writing drafter's save buffers,
12.6 GB pinned in a fresh process, held whatever ran beside them by 5-7 s: the drafter's build,
the first step after a restart, or the second when begun after the first. This asks which
way of pinning holds a running loop least. Each way runs in a fresh process (a restarted
drafter's CUDA context is fresh too), twice: alone, and from a background thread beside a
loop on the main thread that launches a step's worth of GPU work (matmuls and many small
kernels) and waits for it, as the drafter's step loop does. Ways:

* ``alloc``: ``torch.empty(..., pin_memory=True)`` on the default allocator (cudaHostAlloc),
  as the host pool allocated before 2026-12-06;
* ``register``: pageable tensors, then ``cudaHostRegister`` on each in place;
* ``register_filled``: the same on tensors already filled (their pages resident), as a
  read-ahead leaves them: pinning the read tensors instead of new ones;
* ``host_register_alloc``: ``torch.empty(..., pin_memory=True)`` with
  ``PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,pinned_num_register_threads:8``
  (torch's allocator touches the pages on 8 threads, then registers them): what every actor
  starts with since (pipeline.ray_start.HOST_REGISTER_CONF);
* ``pageable`` (the baseline, and the only way on CPU): ``torch.empty`` alone.

Per way: ``pin_s`` (the pinning's wall time), the loop's median step before it, and
``excess_s``: how much longer than that median the steps that overlapped the pinning took
together (the stall a training step would see), with the longest such step. Every pinned
tensor is checked to be pinned and to take a non-blocking copy from the GPU intact.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from pipeline.ray_start import HOST_REGISTER_CONF  # what every actor starts with

WAYS = ("alloc", "register", "register_filled", "host_register_alloc", "pageable")


def excess(steps: list[tuple[float, float]], window: tuple[float, float],
           median: float) -> tuple[float, float, int]:
    """(seconds over ``median`` summed, the longest step, how many) over the steps
    ``(start, end)`` that overlap ``window``."""
    over = [(end - start) for start, end in steps if end > window[0] and start < window[1]]
    return sum(max(0.0, d - median) for d in over), max(over, default=0.0), len(over)


def _allocate(way: str, count: int, numel: int) -> list:
    import torch

    pin = way in ("alloc", "host_register_alloc")
    return [torch.empty(numel, dtype=torch.float32, pin_memory=pin) for _ in range(count)]


def _register(tensors: list) -> None:
    import torch

    cudart = torch.cuda.cudart()
    for i, t in enumerate(tensors):
        err = cudart.cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister failed on tensor {i}: {err}")


def _work(device: str):
    """One step's worth of work: matmuls and many small kernels, then a wait for them."""
    import torch

    size = 4096 if device == "cuda" else 128
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    small = torch.randn(4096, device=device)

    def step() -> None:
        x = a
        for _ in range(8):
            x = x @ a
        y = small
        for _ in range(200):
            y = y * 1.0001 + 0.0001
        if device == "cuda":
            torch.cuda.synchronize()
    return step


def child(way: str, loop: bool, gb: float, count: int, device: str) -> dict:
    import torch

    if device == "cuda":
        torch.empty(1, device="cuda")  # the context, before anything is timed
    numel = int(gb * 1e9 / 4 / count)
    result = {"way": way, "loop": loop}
    step = _work(device) if loop else None
    steps: list[tuple[float, float]] = []
    box: dict = {}
    ready = None
    if way == "register_filled":  # what a read-ahead leaves: filled pageable tensors
        ready = _allocate(way, count, numel)
        for t in ready:
            t.fill_(1.0)

    def pin() -> None:
        t0 = time.perf_counter()
        try:
            tensors = ready if ready is not None else _allocate(way, count, numel)
            if way in ("register", "register_filled"):
                _register(tensors)
            box["tensors"] = tensors
        except BaseException as exc:  # raised again on the main thread
            box["error"] = exc
        box["window"] = (t0, time.perf_counter())

    def timed_step() -> None:
        s = time.perf_counter()
        step()
        steps.append((s, time.perf_counter()))

    if loop:
        for _ in range(5):
            step()  # warm
        t_end = time.perf_counter() + 2.0
        while time.perf_counter() < t_end:
            timed_step()
        median = statistics.median(e - s for s, e in steps)
        thread = threading.Thread(target=pin, name="pin")
        thread.start()
        while thread.is_alive() or time.perf_counter() < box["window"][1] + 0.5:  # and after
            timed_step()
        thread.join()
    else:
        pin()
    if "error" in box:
        raise box["error"]
    if loop:
        total, longest, n = excess(steps, box["window"], median)
        result.update(median_step_ms=median * 1e3, steps_beside=n, excess_s=total,
                      longest_step_ms=longest * 1e3)
    result["pin_s"] = box["window"][1] - box["window"][0]
    tensors = box["tensors"]
    if way != "pageable":
        result["all_pinned"] = all(t.is_pinned() for t in tensors)
        src = torch.arange(numel, device=device, dtype=torch.float32)
        tensors[-1].copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        result["copy_intact"] = bool(torch.equal(tensors[-1], src.cpu()))
        if way in ("register", "register_filled"):
            cudart = torch.cuda.cudart()
            for t in tensors:
                cudart.cudaHostUnregister(t.data_ptr())
    return result


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=12.6, help="host memory to pin (the 8B drafter's "
                                                          "weights and AdamW moments)")
    p.add_argument("--tensors", type=int, default=105)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--ways", default=",".join(WAYS))
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--loop", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, bool(args.loop), args.gb, args.tensors, args.device)))
        return {}
    ways = args.ways.split(",")
    unknown = [w for w in ways if w not in WAYS]
    if unknown or (args.device == "cpu" and ways != ["pageable"]):
        raise SystemExit(f"bench.pin_probe: --ways {args.ways}: allowed {', '.join(WAYS)} "
                         "(on --device cpu: pageable alone, pinning needs CUDA)")
    runs = []
    for way in ways:
        for loop in (0, 1):
            env = dict(os.environ)
            if way == "host_register_alloc":
                env["PYTORCH_CUDA_ALLOC_CONF"] = HOST_REGISTER_CONF
            cmd = [sys.executable, "-m", "bench.pin_probe", "--child", way, "--loop", str(loop),
                   "--gb", str(args.gb), "--tensors", str(args.tensors), "--device", args.device]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                runs.append({"way": way, "loop": bool(loop),
                             "error": (done.stderr.strip().splitlines() or ["?"])[-1]})
            else:
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), flush=True)
    result = {"gb": args.gb, "tensors": args.tensors, "device": args.device,
              "date": time.strftime("%Y-%m-%d"), "runs": runs}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    failed = [r for r in runs if "error" in r or r.get("all_pinned") is False
              or r.get("copy_intact") is False]
    if failed:
        raise SystemExit(f"bench.pin_probe: {len(failed)} run(s) failed or left a tensor "
                         f"unpinned or a copy wrong: {failed}")
    return result


if __name__ == "__main__":
    main()
