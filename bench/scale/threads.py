"""The design this project replaces: target and drafter as threads of one process.

One thread runs the target and queues its tap features (same process, so the tensor itself
travels); another trains the drafter on them. Both share one GIL, one CUDA context and the
device's default stream. The drafter runs eagerly, because CUDA graphs crash in a thread
that did not import torch's CUDA-graph trees (docs/BENCHMARKS.md, "One process per GPU"); with SDPA and its dense mask, the attention the
old trainer used.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import torch

from bench.scale.drafter import make_trainer
from bench.scale.synthetic import token_batch
from bench.scale.target import TAPS
from pipeline.model.target import load_target


def run_threads(path: Path, n: int, seq_len: int, num_anchors: int, warmup: int = 3,
                steps: int = 12, attention: str = "sdpa") -> dict:
    torch.cuda.empty_cache()
    target = load_target(path, TAPS, torch.device("cuda"), torch.bfloat16)
    trainer = make_trainer(num_anchors, attention, "off")
    ids, mask = token_batch(n, seq_len, trainer.spec.hf_config["vocab_size"], "cuda")
    ready: queue.Queue = queue.Queue(maxsize=4)
    total = warmup + steps
    errors: list[BaseException] = []

    def produce():
        try:
            for _ in range(total):
                ready.put(target(ids))
        except BaseException as exc:  # surfaced by the caller
            errors.append(exc)
            ready.put(None)

    marks: list[float] = []

    def consume():
        try:
            for i in range(total):
                feats = ready.get()
                if feats is None:
                    return
                trainer.forward_backward(feats, ids, mask, list(range(i * n, (i + 1) * n)), 0)
                trainer.step()
                torch.cuda.synchronize()
                marks.append(time.perf_counter())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    del target, trainer
    torch.cuda.empty_cache()
    if errors:
        raise errors[0]
    dt = marks[-1] - marks[warmup - 1]
    return {"n": n, "seq_len": seq_len, "num_anchors": num_anchors, "attention": attention,
            "samples_per_s": n * steps / dt}
