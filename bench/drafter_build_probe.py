"""Where a drafter's start-up goes at the 8B recipe, in one process on one device:

    python -m bench.drafter_build_probe [--checkpoint DIR] [--out FILE]
    python -m bench.drafter_build_probe --tiny --device cpu --checkpoint DIR   # the plumbing

In bench.e2e_8b on an H100 (2026-12-05) the drafter's build took 0.4-0.5 s at a job's start
and 10.2 s at the restart after a lost drafter, where the checkpoint's read-ahead runs beside
it; and 6.5-9.2 s went to setting up gradients, AdamW and the compile wrapper. This times, in
order: the build alone (the drafter drawn on the device, the target's embedding and head
copied to it, as ``DrafterTrainer`` does); the set-up's parts (the first ``torch.compile``
pays dynamo's import); the build beside a thread allocating the checkpoint's tensors in pinned
host memory, then in pageable memory (each filled, as a read fills them); the build alone
again. With ``--checkpoint DIR`` it then saves the drafter and its AdamW state there (12.6 GB
at the 8B recipe, as a job's checkpoint) and times the real read-ahead alone, the build beside
it, and the build beside it with the interpreter's thread switch interval at 0.5 ms (a thread
that releases the GIL for each of many short calls, as the build does, may wait up to the
interval each time to take it back from the reading threads). Last, each in a fresh process
(dynamo's import is paid once a process), a restart's constructor and load in three ways: as
the drafter worker runs it (the read-ahead begun before the build, into pinned memory), with
the read-ahead begun after the build, beside the set-up instead, and as it runs now but into
pageable memory (``restart_order``). Prints a JSON of seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pipeline.model.config import DrafterConfig, build_drafter_spec, qwen3_8b_config
from pipeline.training.drafter_trainer import build_drafter

RECIPE = dict(num_layers=5, block_size=16, target_layer_ids=[1, 9, 17, 25, 33],
              mask_token_id=151669, num_anchors=512, gamma=7.0, attention="flex",
              compile="default", static_shapes=True)  # conf/drafter/qwen3_8b.yaml
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=152000)  # the 8B recipe's layers and taps, small widths


@dataclass
class Probe:
    device: str
    target: dict
    head: list[torch.Tensor] = field(default_factory=list)  # pageable, as read from disk

    @property
    def pinned(self) -> bool:  # pinned host memory needs CUDA
        return self.device == "cuda"

    def spec(self):
        return build_drafter_spec(self.target, DrafterConfig(**RECIPE))

    def timed(self, fn):
        start = time.perf_counter()
        out = fn()
        if self.device == "cuda":
            torch.cuda.synchronize()
        return out, time.perf_counter() - start

    def build(self, spec):
        def build():
            model = build_drafter(spec, 0, self.device)
            model.head = [t.to(self.device) for t in self.head]
            return model
        return self.timed(build)

    def release(self) -> None:
        if self.device == "cuda":
            torch.cuda.empty_cache()


def _beside(probe: Probe, spec, sizes: list[int], pin: bool) -> dict[str, float]:
    """The build while a thread allocates and fills host tensors of ``sizes`` (checkpoint)."""
    done: dict[str, float] = {}

    def allocate() -> None:
        start = time.perf_counter()
        held = [torch.empty(n, dtype=torch.float32, pin_memory=pin).fill_(1.0) for n in sizes]
        done["host_s"] = time.perf_counter() - start
        del held

    thread = threading.Thread(target=allocate)
    thread.start()
    model, seconds = probe.build(spec)
    thread.join()
    del model
    probe.release()
    return {"build_s": seconds, **done}


def _taken(ahead, folder: Path):
    """``ahead``'s host copy of ``folder``; a read-ahead that gave nothing (not started, or
    failed: the log says why) is an error, not a figure."""
    host = ahead.take(folder) if ahead is not None else None
    if host is None:
        raise RuntimeError(f"reading {folder} ahead gave nothing (the log says why)")
    return host


def _read_ahead(probe: Probe, spec, folder: Path) -> dict[str, float]:
    from pipeline.checkpoint import sharded
    from pipeline.checkpoint.host_copy import HostPool
    from pipeline.checkpoint.read_ahead import ReadAhead
    from pipeline.checkpoint.writer import AsyncSaver

    model = build_drafter(spec, 0, probe.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # AdamW's two moments exist, as in a checkpoint of a trained drafter
    out: dict[str, float] = {}
    start = time.perf_counter()
    saver = AsyncSaver(HostPool([], pin=False), group=None, owner=True, threads=4)
    saver.start(lambda: sharded.drafter_state(model, optimizer), lambda: {"steps_done": 1},
                folder, 1)
    (done,) = saver.wait()
    if done.error is not None:
        raise RuntimeError(f"saving {folder}: {done.error}")
    out["saved_s"] = time.perf_counter() - start
    del model, optimizer, saver
    probe.release()

    def read(build: bool, interval: float) -> tuple[float, float]:
        default = sys.getswitchinterval()
        sys.setswitchinterval(interval)
        try:
            start = time.perf_counter()
            ahead = ReadAhead.start(folder, pin=probe.pinned)
            built, seconds = probe.build(spec) if build else (None, 0.0)
            host = _taken(ahead, folder)
            total = time.perf_counter() - start
        finally:
            sys.setswitchinterval(default)
        del built, host
        probe.release()
        return seconds, total

    interval = sys.getswitchinterval()
    _, out["read_alone_s"] = read(False, interval)
    out["build_beside_read_s"], out["read_with_build_s"] = read(True, interval)
    out["build_beside_read_0.5ms_s"], out["read_with_build_0.5ms_s"] = read(True, 0.0005)
    return out


def _restart(probe: Probe, spec, folder: Path, order: str, pin: bool) -> dict[str, float]:
    """A restart's constructor in a fresh process: the device, then the build and the set-up
    (dynamo's import, the compile wrapper, AdamW), with the read-ahead begun before the build
    (``before``, the drafter worker's order) or after it (``after``), then its wait and the
    load from host memory (weights copied, AdamW given its state). ``pin``: the read-ahead's
    tensors in pinned memory, as the drafter worker's rank 0 reads them on CUDA."""
    from pipeline.checkpoint.read_ahead import ReadAhead

    out: dict[str, float] = {}
    _, out["device_ready_s"] = probe.timed(lambda: torch.empty(1, device=probe.device))
    start = time.perf_counter()
    ahead = ReadAhead.start(folder, pin=pin) if order == "before" else None
    model, out["build_s"] = probe.build(spec)
    if order == "after":
        ahead = ReadAhead.start(folder, pin=pin)
    set_up = time.perf_counter()
    __import__("torch._dynamo")
    torch.compile(model, dynamic=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    out["setup_s"] = time.perf_counter() - set_up
    waited = time.perf_counter()
    host = _taken(ahead, folder)
    out["read_wait_s"] = time.perf_counter() - waited
    _, out["load_s"] = probe.timed(lambda: host.load_into(model, optimizer))
    out["total_s"] = time.perf_counter() - start
    return out


# A restart's orders: (order, pinned read-ahead where the device allows it).
RESTARTS = {"before": ("before", True), "after": ("after", True),
            "before_pageable": ("before", False)}


def _restart_orders(args) -> dict[str, dict[str, float]]:
    """:func:`_restart` in each of RESTARTS, each in a child process of its own."""
    found = {}
    for name, (order, pin) in RESTARTS.items():
        cmd = [sys.executable, "-m", "bench.drafter_build_probe", "--device", args.device,
               "--checkpoint", args.checkpoint, "--restart-order", order,
               *(["--tiny"] if args.tiny else []), *([] if pin else ["--pageable"])]
        child = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if child.returncode != 0:
            raise RuntimeError(f"the {name} restart failed: {child.stderr[-2000:]}")
        found[name] = json.loads(child.stdout.strip().splitlines()[-1])
    return found


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="small widths: the plumbing on CPU")
    p.add_argument("--checkpoint", default=None, help="a folder to save and read ahead")
    p.add_argument("--out", default=None)
    p.add_argument("--restart-order", choices=("before", "after"), default=None,
                   help="only a restart's constructor with the read-ahead begun before or "
                        "after the build, on the --checkpoint saved by a full run")
    p.add_argument("--pageable", action="store_true",
                   help="with --restart-order: read ahead into pageable host memory")
    args = p.parse_args(argv)
    if args.pageable and not args.restart_order:
        p.error("--pageable applies to --restart-order only (the full run times both kinds)")
    target = {**qwen3_8b_config(), **(TINY if args.tiny else {})}
    probe = Probe(args.device, target)
    probe.head = [torch.ones(target["vocab_size"], target["hidden_size"], dtype=torch.bfloat16)
                  for _ in range(2)]
    spec = probe.spec()
    if args.restart_order:
        if not args.checkpoint:
            p.error("--restart-order needs --checkpoint (a folder a full run saved)")
        found = _restart(probe, spec, Path(args.checkpoint), args.restart_order,
                         pin=probe.pinned and not args.pageable)
        print(json.dumps(found), flush=True)
        return found
    result: dict = {"machine": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                    "tiny": args.tiny}
    _, result["device_ready_s"] = probe.timed(lambda: torch.empty(1, device=args.device))
    model, result["build_alone_s"] = probe.build(spec)
    params = list(model.parameters())
    # What a checkpoint holds: the weights and AdamW's two moments, fp32.
    sizes = [p.numel() for p in params] * 3
    result["checkpoint_gb"] = sum(sizes) * 4 / 1e9
    setup = {}
    _, setup["grads_zeroed"] = probe.timed(lambda: [setattr(p, "grad", torch.zeros_like(p))
                                                    for p in params])
    _, setup["dynamo_import"] = probe.timed(lambda: __import__("torch._dynamo"))
    _, setup["compile_wrapper"] = probe.timed(lambda: torch.compile(model, dynamic=False))
    _, setup["adamw"] = probe.timed(lambda: torch.optim.AdamW(params, lr=1e-4))
    result["setup_s"] = setup
    del model, params
    probe.release()
    result["beside_pinned"] = (_beside(probe, spec, sizes, pin=True) if probe.pinned
                               else None)
    result["beside_pageable"] = _beside(probe, spec, sizes, pin=False)
    _, result["build_alone_again_s"] = probe.build(spec)
    if args.checkpoint:
        print(json.dumps(result), flush=True)  # the read-ahead part takes a minute more
        result["read_ahead"] = _read_ahead(probe, spec, Path(args.checkpoint))
        print(json.dumps(result), flush=True)
        del probe.head
        result["restart_order"] = _restart_orders(args)
    print(json.dumps(result, indent=1), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
