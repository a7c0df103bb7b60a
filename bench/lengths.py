"""Real sample lengths on the co-located one-GPU pipeline: padded, bucketed and packed.

    python -m bench.lengths --work /tmp/lengths --out docs/bench   # one H200 (aim: < 9 minutes)
    python -m bench.lengths --tiny --work /tmp/lt --out /tmp/lt_out  # CPU wiring check, minutes

It builds (or reuses under --work) a random-weight target with Qwen3-8B's architecture
(bench/scale/synthetic.py ``build_target``) and writes a synthetic chat set whose lengths
follow Nemotron v1 chat (median 393, mean 528 tokens per sample, as quoted in issue 17): a
log-normal with mu = ln 393 and sigma = sqrt(2 ln(528/393)) ~= 0.769, clipped to [64, 3072]
(bench/scale/lengths_mix.py). Then ``python -m pipeline.train --config-name qwen3_8b
cluster=one_gpu logger=none train.eval.every=-1 train.checkpoint.final=false ...`` runs up to
four times (``--runs`` picks which now; the others' results are read back from --work):

1. ``full_rows``: samples of 3072 tokens each (nothing to pad), ``--full-steps`` steps: the
   pipeline's tokens/s and anchor blocks/s at full rows;
2. ``padded``: the mix with data.batching=pad (every sample padded to 3072), ``--steps`` steps;
3. ``bucket``: the mix with data.batching=bucket (the preset's buckets [512, 1024, 2048, 3072],
   6144 tokens and 2048 anchor blocks per micro-batch at most), ``--steps`` steps;
4. ``pack``: the mix with data.batching=pack (the same buckets for the target; the drafter
   runs each micro-batch as one 6144-token sequence with a pool of 2048 anchor blocks, filled
   with real anchors), ``--steps`` steps.

Rates come from each run's metrics.jsonl: the first ``--skip`` steps are left out, and so is
any later step over twice the median step time (a compile of a new bucket's shape). It writes
<out>/h200_lengths.json: ``padded_samples_per_s``, ``bucket_samples_per_s``,
``pack_samples_per_s``, ``packed_samples_per_s`` (pack's rate if measured, else bucket's;
``method`` says which), ``tokens_per_s`` (real, unpadded tokens/s at that rate),
``ideal_samples_per_s`` (full-row tokens/s / the mix's mean sample length), ``efficiency``
(packed / ideal), ``anchor_ideal_samples_per_s`` and ``anchor_efficiency`` (the same with
anchor blocks instead of tokens), ``speedup`` (packed / padded), the distribution
(parameters and the measured token lengths), the shapes and every command.

Why two ideals: the drafter's work per sample grows with its anchors (up to
drafter.num_anchors = 512 per sample, at most one per supervised token), not with its tokens.
A 400-token sample has ~300 anchors where a 3072-token one has 512, so per token a short
sample costs the drafter several times what a full row does: full-row tokens/s is a bound
that a drafter-bound pipeline cannot reach on short samples, and the anchor ideal is the one
that padding and packing decide.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from bench.run_log import jsonl_rows
from bench.scale import lengths_mix

TINY_SCALE = 256 / 3072  # --tiny: lengths shrunk to the tiny preset's max_length


def _measured(path: Path, tokenizer, max_length: int, block_size: int,
              shapes) -> tuple[list[int], list[int]]:
    """Token lengths and anchor counts of the samples training will see (template applied,
    cut, short ones dropped), as the planner counts them."""
    from pipeline.data import ChatDataset, DataConfig

    data = DataConfig(train_path=str(path), heldout_path=str(path), max_length=max_length)
    samples = list(ChatDataset(str(path), tokenizer, data, block_size))
    return ([int(s.input_ids.numel()) for s in samples],
            list(shapes.anchor_counts(samples).values()))


def _steady_rate(rows: list[dict], skip: int) -> dict:
    steps = [r for r in rows if "perf/samples_per_s" in r and r["step"] > skip]
    if not steps:
        return {"error": "no steady steps in metrics.jsonl"}
    median = statistics.median(r["perf/step_time_s"] for r in steps)
    steady = [r for r in steps if r["perf/step_time_s"] <= 2 * median]
    wall = sum(r["perf/step_time_s"] for r in steady)
    samples = sum(r["perf/samples_per_s"] * r["perf/step_time_s"] for r in steady)
    supervised = sum(r["perf/tokens_per_s"] * r["perf/step_time_s"] for r in steady)
    out = {"steps": len(steady), "compile_steps_left_out": len(steps) - len(steady),
           "samples_per_s": samples / wall, "supervised_tokens_per_s": supervised / wall,
           "median_step_s": median}
    for key in ("perf/target0_busy", "perf/drafter0_busy", "perf/drafter0_max_mem_gb"):
        if all(key in r for r in steady):
            out[key.split("/")[1]] = max(r[key] for r in steady) if "mem" in key else \
                statistics.fmean(r[key] for r in steady)
    return out


def _train(name: str, config: tuple[str, list[str]], overrides: list[str], args, run_dir: Path,
           out: Path) -> dict:
    cmd = [sys.executable, "-m", "pipeline.train", "--config-name", config[0], *config[1],
           *overrides, f"train.out_dir={run_dir}"]
    print(f"[lengths] {name}: {' '.join(cmd)}", flush=True)
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier run's metrics must not count
    t0 = time.perf_counter()
    with open(out / f"lengths_{name}.log", "w") as log:
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                                  env=dict(os.environ), timeout=args.run_timeout)
            error = None if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            error = f"over --run-timeout {args.run_timeout} s"
    result = {"command": cmd, "wall_s": time.perf_counter() - t0}
    metrics = run_dir / "metrics.jsonl"
    rows = jsonl_rows(metrics)  # a run stopped at its time-out may end in half a row
    result.update(_steady_rate(rows, args.skip if name != "full_rows" else args.full_skip))
    if error:
        result["error"] = f"{error}: see lengths_{name}.log"
    print(f"[lengths] {name}: {json.dumps({k: v for k, v in result.items() if k != 'command'})}",
          flush=True)
    return result


def _common(args, target: str) -> tuple[str, list[str]]:
    """(config name, overrides) shared by the three runs."""
    if args.tiny:
        return "config", [f"target.path={target}",
                "cluster.drafters_per_node=1", "cluster.cpus_per_actor=0.5",
                "drafter.static_shapes=true", "data.max_length=256", "data.micro_batch_size=2",
                "logger=none", "train.eval.every=-1", "train.checkpoint.every=0",
                "train.checkpoint.final=false", "train.checkpoint.resume=null",
                "train.plan.epochs=1", "train.log_every=1"]
    return "qwen3_8b", ["cluster=one_gpu", "logger=none",
            f"target.path={target}", "train.eval.every=-1", "train.checkpoint.every=0",
            "train.checkpoint.final=false", "train.checkpoint.resume=null",
            "train.plan.epochs=1", "train.log_every=5"]


def _data(path: Path) -> list[str]:
    return [f"data.train_path={path}", f"data.heldout_path={path}"]


def _shapes(config: tuple[str, list[str]], data: list[str], batching: str = "bucket"):
    """The bucketed (or packed) run's resolved shapes, composed as the CLI composes them."""
    from pipeline.driver.compose import compose_job
    from pipeline.job.assembly import batch_shapes

    job = compose_job(config[1] + data + [f"data.batching={batching}"], config_name=config[0])
    s = batch_shapes(job)
    return {"buckets": list(s.buckets), "rows": list(s.rows),
            "tokens_per_micro_batch": job.data.resolved_tokens_per_micro_batch(),
            "anchors_per_micro_batch": job.data.anchors_per_micro_batch,
            "num_anchors": job.drafter.num_anchors, "max_length": job.data.max_length}, s


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default="/tmp/bench_lengths", help="target folder, data, runs")
    p.add_argument("--out", default="runs/bench_lengths", help="h200_lengths.json and logs")
    p.add_argument("--tiny", action="store_true", help="builtin:tiny target on CPU, few steps")
    p.add_argument("--steps", type=int, default=None, help="padded and bucketed runs (40)")
    p.add_argument("--skip", type=int, default=None, help="warm-up steps left out (8)")
    p.add_argument("--full-steps", type=int, default=None, help="full-row run (16)")
    p.add_argument("--full-skip", type=int, default=None, help="its warm-up steps (6)")
    p.add_argument("--samples", type=int, default=1500, help="chats in the length mix")
    p.add_argument("--run-timeout", type=int, default=300,
                   help="seconds per training run (a cold compile at 8B takes ~3 min)")
    p.add_argument("--runs", default=",".join(RUNS),
                   help="which runs to do now; the others' results are read from --work")
    args = p.parse_args(argv)
    args.runs = [r for r in args.runs.split(",") if r]
    unknown = sorted(set(args.runs) - set(RUNS))
    if unknown:
        p.error(f"--runs: unknown {unknown}; allowed: {','.join(RUNS)}")
    small = (6, 2, 5, 2) if args.tiny else (40, 8, 16, 6)
    for key, default in zip(("steps", "skip", "full_steps", "full_skip"), small):
        if getattr(args, key) is None:
            setattr(args, key, default)
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    from transformers import AutoTokenizer

    if args.tiny:
        from pipeline.assets import ensure_tiny_assets
        target, scale, block, max_length = "builtin:tiny", TINY_SCALE, 8, 256
        tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_assets().target_dir)
    else:
        from bench.scale.synthetic import build_target
        target_dir = build_target(work / "qwen3-8b-random")
        target, scale, block, max_length = str(target_dir), 1.0, 16, 3072
        tokenizer = AutoTokenizer.from_pretrained(target_dir)
    build_s = time.perf_counter() - t0
    per_word = lengths_mix.tokens_per_word(tokenizer)
    mix = lengths_mix.write_mix(work / "mix.jsonl",
                                lengths_mix.sample_lengths(args.samples, scale), per_word)
    full = lengths_mix.write_mix(work / "full_rows.jsonl",
                                 [int(max_length * 1.1)] * (8 * args.full_steps + 32), per_word)
    common = _common(args, target)
    steps = [f"train.plan.max_steps={args.steps}"]
    shapes, s = _shapes(common, _data(mix))
    mix_lengths, mix_anchors = _measured(mix, tokenizer, max_length, block, s)
    full_lengths, full_anchors = _measured(full, tokenizer, max_length, block, s)
    mean_len, full_len = statistics.fmean(mix_lengths), statistics.fmean(full_lengths)
    anchors = {"mean_anchors": statistics.fmean(mix_anchors),
               "full_anchors": statistics.fmean(full_anchors)}
    pack = _shapes(common, _data(mix), "pack")[1]
    shapes["pack_rows"], shapes["pack_pool"] = list(pack.rows), pack.pool
    padded_tokens = sum(s.buckets[s.bucket_of(n)] for n in mix_lengths)
    shapes["token_fill"] = sum(mix_lengths) / padded_tokens  # real / padded tokens, bucketed
    shapes["token_fill_padded"] = mean_len / max_length
    specs = {
        "full_rows": (_data(full) + [f"train.plan.max_steps={args.full_steps}",
                                     "data.batching=pad"]),
        "padded": _data(mix) + steps + ["data.batching=pad"],
        "bucket": _data(mix) + steps + ["data.batching=bucket"],
        "pack": _data(mix) + steps + ["data.batching=pack"],
    }
    runs = _earlier_runs(work)
    for name in args.runs:
        runs[name] = _train(name, common, specs[name], args, work / f"run_{name}", out)
        runs[name]["date"] = time.strftime("%Y-%m-%d %H:%M")
        (work / RUNS_FILE).write_text(json.dumps(runs, indent=2))
    result = {
        **figures(runs, mean_len, full_len, **anchors),
        **anchors,
        "distribution": {**lengths_mix.distribution(scale),
                         "measured_tokens": lengths_mix.summarize(mix_lengths),
                         "tokens_per_word": per_word},
        "full_row_tokens": full_len,
        "shapes": shapes,
        "runs": runs,
        "errors": {k: r["error"] for k, r in runs.items() if "error" in r},
        "target_build_s": build_s,
        "wall_s": time.perf_counter() - t0,
        "command": [sys.executable, "-m", "bench.lengths", *(argv or sys.argv[1:])],
        "device": _device(),
    }
    result["runs_this_invocation"] = list(args.runs)
    (out / "h200_lengths.json").write_text(json.dumps(result, indent=2))
    print(f"[lengths] wrote {out / 'h200_lengths.json'}: " + json.dumps(
        {k: result[k] for k in FIGURES}), flush=True)
    return result


# Full rows first: padded then finds its shapes compiled.
RUNS = ("full_rows", "padded", "bucket", "pack")
RUNS_FILE = "lengths_runs.json"
FIGURES = ("padded_samples_per_s", "bucket_samples_per_s", "pack_samples_per_s",
           "packed_samples_per_s", "tokens_per_s", "ideal_samples_per_s", "efficiency",
           "anchor_efficiency", "speedup", "predicted_node8_samples_per_s")


def _earlier_runs(work: Path) -> dict:
    """Runs an earlier invocation measured under the same --work (--runs splits the three
    runs over several device calls: each pays its own compile at 8B)."""
    path = work / RUNS_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def figures(runs: dict, mean_len: float, full_len: float,
            mean_anchors: Optional[float] = None, full_anchors: Optional[float] = None) -> dict:
    """The JSON's figures from the runs' steady rates; a figure whose runs did not measure
    a rate is null (and the node8 prediction is left out), never NaN.

    ``packed_samples_per_s`` is the pack run's rate where it measured one, else the bucket
    run's (``method`` says which). With the mean anchors per sample of the mix and of full
    rows, ``anchor_ideal_samples_per_s`` is what full rows' anchor blocks per second give the
    mix: the ideal of a drafter-bound pipeline, whose work follows anchors, not tokens.
    """
    rate = {k: runs.get(k, {}).get("samples_per_s") for k in RUNS}

    def ratio(a, b):
        return a / b if a is not None and b else None

    def times(a, b):
        return a * b if a is not None and b is not None else None

    method = "pack" if rate["pack"] is not None else "bucket"
    best = rate[method]
    full_tokens_per_s = times(rate["full_rows"], full_len)
    ideal = ratio(full_tokens_per_s, mean_len)
    anchor_ideal = ratio(times(rate["full_rows"], full_anchors), mean_anchors)
    speedup = ratio(best, rate["padded"])
    out = {
        "method": method,
        "padded_samples_per_s": rate["padded"],
        "bucket_samples_per_s": rate["bucket"],
        "pack_samples_per_s": rate["pack"],
        "packed_samples_per_s": best,
        "tokens_per_s": times(best, mean_len),
        "padded_tokens_per_s": times(rate["padded"], mean_len),
        "full_row_samples_per_s": rate["full_rows"],
        "full_row_tokens_per_s": full_tokens_per_s,
        "ideal_samples_per_s": ideal,
        "efficiency": ratio(best, ideal),
        "anchor_ideal_samples_per_s": anchor_ideal,
        "anchor_efficiency": ratio(best, anchor_ideal),
        "speedup": speedup,
        "predicted_node8_samples_per_s": None,
        "missing": [k for k in RUNS if rate[k] is None],
    }
    if speedup is not None:
        out.update(_node8_prediction(speedup))
    return out


def _node8_prediction(speedup: float) -> dict:
    """8x H200 by cluster.layout=auto's formula (pipeline/driver/layout.py): the node8
    preset's per-role rates at 3072 padded tokens, each scaled by the speedup this mix
    measured on the co-located pipeline (an assumption: both roles gain alike)."""
    from pipeline.driver.compose import compose_job
    from pipeline.driver.layout import predict_node_rate

    rates = compose_job(["cluster=node8"]).cluster.rates
    r_t, r_d = rates.target_samples_per_s * speedup, rates.drafter_samples_per_s * speedup
    return {"predicted_node8_samples_per_s": predict_node_rate(r_t, r_d),
            "predicted_node8_basis": {"target_samples_per_s": r_t, "drafter_samples_per_s": r_d,
                                      "formula": "max over T+D=8 of min(T r_t, D r_d)"}}


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    main()
