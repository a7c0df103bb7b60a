"""The 8B training step's time alone and with a tau evaluation running beside it, one GPU.

    python -m bench.eval_beside_training --shape qwen3_8b --out /tmp/beside.json --work /tmp/beside
    python -m bench.eval_beside_training --shape tiny --device cpu --out /tmp/b.json --work /tmp/b

Two processes share the device, as a training job and its evaluator do (the evaluator runs in
the drafter worker's process in the pipeline; a process of its own here, so that nothing in
one process's Python can pace the other). The trainer: a random-weight target of the shape
cut after its deepest tap (the pipeline's ``TargetFeatures``), and the pipeline's
``DrafterTrainer`` (the 8B preset's drafter: 5 layers, block 16, flex attention, compiled)
trained on its features, micro-batches of 4 x 800 tokens with 256 anchors. The evaluator: the
full target and a random drafter, decoding ``--eval-prompts`` random prompts x
``--eval-new-tokens`` with the batched evaluator exactly as ``evaluate_tau`` drives it (a
low-priority stream, CUDA graphs, ``train.eval.gpu_duty``'s Pacer after every round), again and
again until told to stop.

Phases, synchronised through files in ``--work``: both processes build and warm up; the trainer
times ``--steps`` steps alone; then for each duty of ``--duties`` the evaluator starts
decoding at that duty and the trainer times ``--steps`` steps beside it, then the evaluator
stops. Reported: step ms (median, mean) alone and beside each duty, the slowdown of each (issue 32
asks for at most 10% at the 8B shape), and the evaluator's work in each phase (whole passes over
its prompts, and decode rounds: a draft and a verify of every row).
The JSON is written after every phase.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.run_log import last_line
from pipeline.runtime.diskfull import write_atomic

log = logging.getLogger("bench.eval_beside_training")

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=1024)
SHAPES = {  # target fields (None: Qwen3-8B's), drafter, micro-batch
    "qwen3_8b": dict(fields=None, drafter=dict(num_layers=5, block_size=16, num_anchors=256,
                                               target_layer_ids=[1, 9, 17, 25, 33],
                                               mask_token_id=151669),
                     n=4, seq_len=800),
    "tiny": dict(fields=TINY, drafter=dict(num_layers=1, block_size=4, num_anchors=8,
                                           target_layer_ids=[1, 2], mask_token_id=511),
                 n=2, seq_len=48),
}
POLL_S = 0.05


_DEADLINE = [float("inf")]  # a role's end: it never outlives the driver's --timeout


def _wait(path: Path) -> None:
    while not path.exists():
        if time.monotonic() > _DEADLINE[0]:
            raise TimeoutError(f"past the --timeout, still waiting for {path}")
        time.sleep(POLL_S)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _target(shape: dict, device: str, dtype: torch.dtype):
    from bench.decode_common import random_qwen3

    return random_qwen3(device, dtype, shape["fields"])


# ---- the trainer ---------------------------------------------------------------------------

def _trainer(args, shape: dict):
    """(one training step as a function, the device) on the pipeline's own classes."""
    from torch import nn

    from bench.scale.synthetic import token_batch
    from pipeline.model.config import DrafterConfig, build_drafter_spec
    from pipeline.model.target import TargetFeatures, TargetHead, decoder_layers
    from pipeline.training.config import OptimConfig
    from pipeline.training.drafter_trainer import DrafterTrainer

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    model = _target(shape, args.device, dtype)
    config = model.config.to_dict()
    # Static shapes, as bench.scale.drafter times the 8B drafter: one compiled graph.
    options = DrafterConfig(attention=args.drafter_attention, compile=args.drafter_compile,
                            static_shapes=True, **shape["drafter"])
    spec = build_drafter_spec(config, options)
    head = TargetHead.of_model(model)
    del decoder_layers(model)[max(spec.target_layer_ids) + 1:]  # as load_target cuts it
    model.get_decoder().norm = nn.Identity()
    model.lm_head = nn.Identity()
    target = TargetFeatures(model, spec.target_layer_ids)
    trainer = DrafterTrainer(spec, options, OptimConfig(), 0, head, args.device,
                             dtype if args.device.startswith("cuda") else None,
                             total_steps=100_000)
    ids, mask = token_batch(shape["n"], shape["seq_len"], config["vocab_size"], args.device)
    counter = iter(range(10**9))

    def step() -> float:
        _sync(args.device)
        t0 = time.perf_counter()
        i = next(counter)
        trainer.forward_backward(target(ids), ids, mask, list(range(i * shape["n"],
                                                                    (i + 1) * shape["n"])), 0)
        trainer.step()
        _sync(args.device)
        return 1e3 * (time.perf_counter() - t0)
    return step


def _figures(times: list[float]) -> dict:
    return {"steps": len(times), "median_ms": statistics.median(times),
            "mean_ms": statistics.fmean(times), "max_ms": max(times)}


def run_trainer(args) -> None:
    shape, work = SHAPES[args.shape], Path(args.work)
    step = _trainer(args, shape)
    for _ in range(args.warmup):
        step()
    out = {"shape": args.shape, "device": args.device, "drafter_attention": args.drafter_attention,
           "drafter_compile": args.drafter_compile, "micro_batch": [shape["n"], shape["seq_len"]],
           "phases": {}}
    _wait(work / "eval_ready")  # the evaluator's build and warm-up never overlap a timed phase
    out["phases"]["alone"] = _figures([step() for _ in range(args.steps)])
    write_atomic(work / "trainer.json", json.dumps(out))
    for duty in args.duties:
        (work / f"go_{duty}").write_text("")
        _wait(work / f"started_{duty}")
        times = [step() for _ in range(args.steps)]
        (work / f"stop_{duty}").write_text("")
        _wait(work / f"stopped_{duty}")
        out["phases"][f"beside_duty_{duty}"] = _figures(times)
        write_atomic(work / "trainer.json", json.dumps(out))


# ---- the evaluator -------------------------------------------------------------------------

class _Stop(Exception):
    pass


def run_evaluator(args) -> None:
    import random

    from pipeline.eval.batched import RowDrafter, decode_many
    from pipeline.eval.config import DecodeOptions
    from pipeline.eval.share import Pacer, evaluator_stream
    from pipeline.eval.speculative import DrafterProposer
    from pipeline.model.config import DrafterConfig, build_drafter_spec
    from pipeline.model.drafter import DFlashDrafter
    from pipeline.model.target import TargetHead

    shape, work = SHAPES[args.shape], Path(args.work)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    target = _target(shape, args.device, dtype)
    config = target.config.to_dict()
    spec = build_drafter_spec(config, DrafterConfig(**shape["drafter"]))
    torch.manual_seed(1)
    with torch.device(dev):
        drafter = DFlashDrafter(spec).eval()
    proposer = RowDrafter(DrafterProposer(drafter, TargetHead.of_model(target)))
    rng = random.Random(0)
    vocab = config["vocab_size"]
    prompts = [[rng.randrange(4, vocab - 1) for _ in range(rng.randint(64, 128))]
               for _ in range(args.eval_prompts)]

    def decode(duty: float, stop: Path | None, count: list[int]) -> None:
        options = DecodeOptions(batch_size=args.eval_batch, cuda_graphs="auto",
                                stream_priority="low", gpu_duty=duty)
        pacer = Pacer(dev, duty)

        def pace() -> None:
            pacer()
            count[1] += 1
            if stop is not None and (stop.exists() or time.monotonic() > _DEADLINE[0]):
                raise _Stop
        with torch.no_grad(), evaluator_stream(dev, options):
            decode_many(target, proposer, prompts, spec.target_layer_ids, args.eval_new_tokens,
                        None, options.batch_size, graphs=options.graphs_on(dev.type), pace=pace)
        count[0] += len(prompts)

    decode(1.0, None, [0, 0])  # warm-up: kernels, graphs once
    _sync(args.device)
    (work / "eval_ready").write_text("")
    result = {}
    for duty in args.duties:
        _wait(work / f"go_{duty}")
        (work / f"started_{duty}").write_text("")
        done, t0 = [0, 0], time.perf_counter()
        try:
            while True:
                decode(duty, work / f"stop_{duty}", done)
        except _Stop:
            pass
        _sync(args.device)
        result[str(duty)] = {"passes_over_prompts": done[0], "rounds": done[1],
                             "seconds": time.perf_counter() - t0}
        (work / f"stopped_{duty}").write_text("")
    write_atomic(work / "evaluator.json", json.dumps(result))


# ---- the driver ----------------------------------------------------------------------------

def _summary(work: Path) -> dict:
    trainer = json.loads((work / "trainer.json").read_text()) if (work / "trainer.json").exists() else {}
    evaluator = (json.loads((work / "evaluator.json").read_text())
                 if (work / "evaluator.json").exists() else {})
    phases = trainer.get("phases", {})
    # Both: the median says how a typical step fares, the mean what the job's throughput pays
    # (on the H200 the median hid the few steps that meet an evaluator's prefill chunk).
    slowdown = {}
    for stat in ("median_ms", "mean_ms"):
        alone = phases.get("alone", {}).get(stat)
        slowdown[stat] = {name: round(f[stat] / alone - 1, 4) for name, f in phases.items()
                          if name != "alone" and alone}
    return {**trainer, "slowdown_vs_alone": slowdown["median_ms"],
            "slowdown_mean_vs_alone": slowdown["mean_ms"], "evaluator": evaluator}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=tuple(SHAPES), default="qwen3_8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--duties", default="0.2,1.0", help="train.eval.gpu_duty values, in order")
    p.add_argument("--eval-prompts", type=int, default=64)
    p.add_argument("--eval-batch", type=int, default=64)
    p.add_argument("--eval-new-tokens", type=int, default=256)
    p.add_argument("--drafter-attention", default=None, help="default: flex on cuda, sdpa on cpu")
    p.add_argument("--drafter-compile", default=None, help="default: default on cuda, off on cpu")
    p.add_argument("--role", choices=("driver", "train", "eval"), default="driver")
    p.add_argument("--work", required=True, help="a folder for the phase files")
    p.add_argument("--out", default=None)
    p.add_argument("--timeout", type=float, default=480.0, help="seconds for both processes")
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    args.drafter_attention = args.drafter_attention or ("flex" if cuda else "sdpa")
    args.drafter_compile = args.drafter_compile or ("default" if cuda else "off")
    duties = [float(d) for d in args.duties.split(",") if d]
    bad = [d for d in duties if not 0 < d <= 1]
    if bad or not duties:
        p.error(f"--duties {args.duties}: want values in (0, 1]")
    args.duties = duties
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    _DEADLINE[0] = time.monotonic() + args.timeout
    if args.role == "train":
        run_trainer(args)
        return {}
    if args.role == "eval":
        run_evaluator(args)
        return {}
    return drive(args, argv or sys.argv[1:])


def drive(args, argv: list[str]) -> dict:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    for old in work.iterdir():
        if old.is_file():
            old.unlink()
    base = [sys.executable, "-m", "bench.eval_beside_training", *argv]
    logs = [open(work / f"{role}.log", "w") for role in ("train", "eval")]
    procs = [subprocess.Popen(base + ["--role", role], stdout=log_, stderr=subprocess.STDOUT)
             for role, log_ in zip(("train", "eval"), logs)]
    end = time.monotonic() + args.timeout
    result: dict = {}
    try:
        while any(proc.poll() is None for proc in procs):
            if time.monotonic() > end or any(proc.poll() not in (None, 0) for proc in procs):
                break
            time.sleep(0.5)
            result = _write(args, work)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log_ in logs:
            log_.close()
    result = _write(args, work)
    # The roles' handshake files say nothing once both have ended: only logs and figures stay.
    for name in ("eval_ready", "go_*", "started_*", "stop_*", "stopped_*"):
        for path in work.glob(name):
            path.unlink()
    codes = [proc.returncode for proc in procs]
    if codes != [0, 0]:
        # Each failed role's last line in the error itself: the logs may not outlive the machine.
        causes = "; ".join(f"{role}: {last_line(work / f'{role}.log')}"
                           for role, code in zip(("train", "eval"), codes) if code != 0)
        result["error"] = (f"trainer rc {codes[0]}, evaluator rc {codes[1]} ({causes}): see "
                           f"{work}/train.log and {work}/eval.log")
        _write(args, work, result)
        log.error("%s", result["error"])
    print(json.dumps(result, indent=1))
    return result


def _write(args, work: Path, result: dict | None = None) -> dict:
    result = result if result is not None else _summary(work)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    sys.exit(1 if "error" in main() else 0)
