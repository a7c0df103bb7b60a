"""How long a checkpoint save holds the step loop, at the Qwen3-8B drafter's shape, without Ray.

    python -m bench.checkpoint_stall --out /tmp/stall [--layers 5] [--saves 3] [--threads 1,4]
    python -m bench.checkpoint_stall --out /tmp/stall --device cpu --layers 1 --saves 2

Builds the 8B recipe's drafter (5 layers at Qwen3-8B's width: 12.6 GB of fp32 weights and
AdamW moments) on the GPU, takes one AdamW step so the moments exist, and saves it through
the checkpoint writer the drafter workers use (pipeline/checkpoint/writer.py: a copy into
pinned host buffers allocated beforehand, then torch.distributed.checkpoint and the owner's
``trainer.pt`` written and hashed in a background thread), ``--saves`` times into
``--out`` for each of ``--threads`` (train.checkpoint.write_threads: DCP files written at
once), then loads the last one back (``load_s``). A restart builds a drafter and loads into
it; ``restart`` does that twice, each in a fresh process: the build, then the load from the
files (``fresh_load_s``: what a restart waited for before read-ahead), and the build with the
checkpoint read into host memory beside it (pipeline/checkpoint/read_ahead.py), then the load
from there (``load_after_read_ahead_s``: what a restart waits for now). Prints one
JSON line: ``stall_s`` per save (what the step loop waits for: the driver logs it as "held
training"), ``write_s`` per save (beside training), keyed by the thread count, and the bytes
written. ``--small`` runs a narrow drafter on the CPU (a check of the script itself).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from pipeline.checkpoint import read_ahead, sharded
from pipeline.checkpoint.host_copy import HostPool
from pipeline.checkpoint.writer import AsyncSaver
from pipeline.model.config import DrafterConfig, build_drafter_spec, qwen3_8b_config
from pipeline.model.drafter import DFlashDrafter


def measure(out: Path, layers: int = 5, saves: int = 3, device: str = "cuda",
            small: bool = False, threads: tuple[int, ...] = (1,)) -> dict:
    """Stall and background time of ``saves`` saves of an 8B-shaped drafter into ``out``."""
    model, optim = _drafter(_spec(layers, small), device)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optim.step()  # the moments exist, as after any training step
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    pool = HostPool([(tuple(p.shape), p.dtype) for p in params for _ in range(3)],
                    pin=device == "cuda")
    pool._thread.join()  # a worker pins its buffers when its group forms, long before a save
    rows, folder = [], None
    for n in threads:
        saver = AsyncSaver(pool, group=None, owner=True, threads=n)
        for i in range(saves):
            if folder is not None:
                shutil.rmtree(folder)
            folder = out / f"save_{n}_{i}"
            shutil.rmtree(folder, ignore_errors=True)
            t0 = time.perf_counter()
            held = saver.start(lambda: sharded.drafter_state(model, optim),
                               lambda: {"steps_done": i, "rng": {"cpu": torch.get_rng_state()}},
                               folder, i)
            (done,) = saver.wait()
            assert done.error is None, done.error
            rows.append({"threads": n, "stall_s": held, "write_s": done.write_s,
                         "bytes": sum(r.size for r in done.records),
                         "files": len(done.records), "wall_s": time.perf_counter() - t0})
    load_s = _timed(lambda: sharded.load(model, optim, folder, group=None), device)
    del model, optim, params, pool, saver  # the restarted drafter's memory is its own
    restarts = _restart_loads(layers, small, device, folder)
    shutil.rmtree(folder)
    return {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "params": n_params, "saves": rows,
            "stall_s": [r["stall_s"] for r in rows],
            "write_s": {n: [r["write_s"] for r in rows if r["threads"] == n] for n in threads},
            "load_s": load_s, **restarts}


def _spec(layers: int, small: bool):
    target = qwen3_8b_config()
    if small:
        target.update(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, vocab_size=1024)
    return build_drafter_spec(target, DrafterConfig(num_layers=layers, mask_token_id=0))


def _drafter(spec, device: str):
    model = DFlashDrafter(spec).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _timed(fn, device: str) -> float:
    t0 = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _restart_loads(layers: int, small: bool, device: str, folder: Path) -> dict:
    """A restarted drafter's build and load of ``folder``, each way in a fresh process (so
    neither inherits the other's memory): loading from the files after the build, and reading
    ahead beside the build (pinned on CUDA, as the rank that writes checkpoints reads it)."""
    ctx = multiprocessing.get_context("spawn")
    out = {}
    for name, ahead in (("from_files", False), ("read_ahead", True)):
        with ProcessPoolExecutor(1, mp_context=ctx) as pool:
            out[name] = pool.submit(_restart_once, layers, small, device, folder, ahead).result()
    return {"restart": out, "fresh_load_s": out["from_files"]["load_s"],
            "load_after_read_ahead_s": out["read_ahead"]["load_s"]}


def _restart_once(layers: int, small: bool, device: str, folder: Path, ahead: bool) -> dict:
    t0 = time.perf_counter()
    if device == "cuda":
        torch.empty(1, device=device)  # the CUDA context first, as in a drafter
    reading = read_ahead.ReadAhead.start(folder, pin=device == "cuda") if ahead else None
    model, optim = _drafter(_spec(layers, small), device)  # the build
    t1 = time.perf_counter()
    host = reading.take(folder) if reading is not None else None
    t2 = time.perf_counter()
    load_s = _timed(lambda: sharded.load(model, optim, folder, group=None, host=host), device)
    return {"built_s": t1 - t0, "waited_s": t2 - t1 if ahead else None, "load_s": load_s,
            "total_s": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--threads", default="1,4",
                        help="comma-separated train.checkpoint.write_threads values")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--small", action="store_true", help="a narrow drafter, on the CPU")
    args = parser.parse_args()
    device = "cpu" if args.small else args.device
    threads = tuple(int(t) for t in args.threads.split(","))
    print(json.dumps(measure(args.out, args.layers, args.saves, device, args.small, threads)))


if __name__ == "__main__":
    main()
