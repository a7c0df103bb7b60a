"""What checking the data before Ray costs: a parse pass, the full encode, and the hand-over.

    python -m bench.data_preflight                 # the demo data and 50k synthetic chats
    python -m bench.data_preflight --synthetic 5000

The driver encodes the training file once (pipeline/job_data.py) and hands the encoded set to
the prefetcher through Ray's object store. This prints, per file: a parse pass alone (what a
cheaper check would cost; it finds neither template errors nor samples too short), the full
encode, the pickled size, ``ray.put``, and how long a prefetcher takes to be ready with it.
The synthetic file joins two demo chats per line (two exchanges, ~1.2 KB), tiny tokenizer.
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import tempfile
import time
from pathlib import Path


def _synthetic(source: Path, n: int, path: Path) -> Path:
    rng = random.Random(0)
    chats = [json.loads(line)["messages"] for line in source.read_text().splitlines()]
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"messages": rng.choice(chats) + rng.choice(chats)}) + "\n")
    return path


def _measure(path: Path, tokenizer) -> dict:
    import ray

    from pipeline.data import ChatDataset, DataConfig, DataStats, read_conversations
    from pipeline.data.batching import BatchShapes
    from pipeline.ray_start import Placement, kill_actors, start_actor
    from pipeline.workers.prefetcher import Prefetcher

    cfg, row = DataConfig(max_length=512), {"file": path.name, "mb": path.stat().st_size / 1e6}
    t = time.perf_counter()
    for _ in read_conversations(str(path), stats=DataStats()):
        pass
    row["parse_s"] = time.perf_counter() - t
    t = time.perf_counter()
    dataset = ChatDataset(str(path), tokenizer, cfg, block_size=8)
    row["encode_s"], row["samples"] = time.perf_counter() - t, len(dataset)
    t = time.perf_counter()
    row["pickled_mb"] = len(pickle.dumps(dataset, protocol=5)) / 1e6
    row["pickle_s"] = time.perf_counter() - t
    t = time.perf_counter()
    ref = ray.put(dataset)
    row["put_s"] = time.perf_counter() - t
    t = time.perf_counter()
    prefetcher = start_actor(Prefetcher, Placement(cpus=1), dataset=ref, data=cfg, epochs=1,
                             micro_batches_per_step=2, max_steps=None, pad_token_id=0,
                             shapes=BatchShapes.from_config(cfg, False, 512))
    ray.get(prefetcher.next_micro_batch.remote())
    row["prefetcher_ready_s"] = time.perf_counter() - t  # mostly the actor process starting
    kill_actors([prefetcher])
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", type=int, default=50_000, help="conversations")
    args = parser.parse_args()
    import ray
    from transformers import AutoTokenizer

    from pipeline.assets import ensure_tiny_assets

    assets = ensure_tiny_assets()
    tokenizer = AutoTokenizer.from_pretrained(assets.target_dir)
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            synthetic = _synthetic(Path(assets.train_path), args.synthetic,
                                   Path(tmp) / f"synthetic_{args.synthetic}.jsonl")
            for path in (Path(assets.train_path), synthetic):
                print(json.dumps(_measure(path, tokenizer)), flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
