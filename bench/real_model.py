"""A drafter for a real pretrained model, SmolLM2-135M-Instruct from its GGUF file (issue 33).

    # H200, two commands of ~3 and ~6.5 minutes (estimates; sizes are flags, see
    # bench/real_model_scale.py):
    python -m bench.real_model --out docs/bench --work /tmp/real --until data
    python -m bench.real_model --out docs/bench --work /tmp/real --curve
    python -m bench.real_model --scale tiny --out /tmp/r_out --work /tmp/r_work  # CPU, minutes

Stages, each resumable (``WORK/state.json`` records those done; a call runs the ones not done,
up to ``--until``):
1. convert: the GGUF file into a cached HF folder (pipeline/assets/gguf.py), as ``target.path``
   does in every trainer;
2. prompts: prompts-only chat lines about every documented API on the machine, split by source
   module (bench/real_model_prompts.py), and HumanEval's prompts;
3. data: training, HumanEval and held-out ``explain`` prompts answered greedily by the target
   in one ``python -m pipeline.regenerate`` call; the answers' distinct 4-grams and the share
   that ended their turn;
4. drafters: ``python -m pipeline.train --config-name smollm2_135m`` and
   ``python -m pipeline.train_single`` with the same overrides, side by side (tau on HumanEval
   from the evaluator and the reference run);
5. export: the pipeline's export decoded apart (bench/quality/reference_decode.py) on HumanEval
   and on the held-out explain prompts, with acceptance per block position;
6. curve (``--curve``): the reference trainer on 4 data sizes over a 16x range.

Writes ``OUT/real_model.json`` (keys listed in issue 33: target, train_samples, the taus,
greedy_distinct_4grams, greedy_ended_share, gpu_minutes by stage, data_curve) and the last
lines of each log; large files stay in WORK.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
from pathlib import Path

import torch

from bench.quality import proc
from bench.real_model_scale import SCALES, RealScale
from bench.real_model_steps import STAGES, Work, run_stage

log = logging.getLogger("bench.real_model")
_MARKER = ".real_model"


def run(scale: RealScale, out: Path, work: Path, until: str, curve: bool) -> dict:
    """The stages not yet done, in order, up to ``until``; the result so far is kept."""
    state_path = work / "state.json"
    state = (json.loads(state_path.read_text()) if state_path.exists()
             else {"done": [], "result": {"gpu_minutes": {}}})
    result = state["result"]
    result.update({"scale": scale.name, "device": scale.device})
    w = Work(work)
    wanted = [s for s in STAGES if s != "curve" or curve]
    stop = wanted.index(until) + 1 if until in wanted else len(wanted)
    try:
        for stage in wanted[:stop]:
            if stage in state["done"]:
                continue
            started = time.perf_counter()
            result.update(run_stage(stage, scale, w, result))
            minutes = (time.perf_counter() - started) / 60
            # Every stage holds the device machine, CPU-bound ones too: its wall counts.
            result["gpu_minutes"][stage] = round(minutes, 2)
            state["done"].append(stage)
            state_path.write_text(json.dumps(state, indent=2))
    finally:
        result["gpu_minutes"]["total"] = round(sum(
            v for k, v in result["gpu_minutes"].items() if k != "total"), 2)
        state_path.write_text(json.dumps(state, indent=2))
        for path in sorted((work / "logs").glob("*.log")) if (work / "logs").exists() else []:
            (out / f"real_model_{path.name}").write_text(proc.tail(path, 120))
        (out / "real_model.json").write_text(json.dumps(result, indent=2))
        log.info("wrote %s", out / "real_model.json")
    return result


# Fields of RealScale a run may override from the command line, with their types.
_SIZE_FLAGS = (("train-prompts", int), ("heldout-prompts", int), ("humaneval-prompts", int),
               ("max-new-tokens", int), ("max-steps", int), ("epochs", int),
               ("eval-prompts", int), ("eval-every", int), ("drafter-layers", int),
               ("num-anchors", int), ("lr", float), ("train-budget-s", float))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.real_model",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="small results: real_model.json, log tails")
    p.add_argument("--work", default="/tmp/real_model", help="large files: target, data, runs")
    p.add_argument("--scale", default="h200", choices=sorted(SCALES))
    p.add_argument("--until", default="curve", choices=STAGES, help="stop after this stage")
    p.add_argument("--curve", action="store_true", help="also the reference's data curve")
    p.add_argument("--fresh", action="store_true", help="empty --work first")
    p.add_argument("--gguf", help="the target's GGUF file (default: the scale's)")
    p.add_argument("--humaneval", help="HumanEval.jsonl(.gz) (default: the scale's)")
    p.add_argument("--prompts", help="a folder written by python -m bench.real_model_prompts "
                   "(on another machine, say) used instead of walking this one's packages")
    for flag, kind in _SIZE_FLAGS:
        p.add_argument(f"--{flag}", type=kind, help="override the scale's value")
    args = p.parse_args(argv)
    sizes = {flag.replace("-", "_"): getattr(args, flag.replace("-", "_"))
             for flag, _ in _SIZE_FLAGS}
    scale = SCALES[args.scale].with_sizes(
        gguf=args.gguf, humaneval=args.humaneval, prompts_dir=args.prompts, **sizes)
    if scale.device == "cuda" and not torch.cuda.is_available():
        p.exit(2, f"{p.prog}: error: --scale {scale.name} needs CUDA; use --scale tiny\n")
    out, work = Path(args.out).resolve(), Path(args.work).resolve()
    if work.exists() and any(work.iterdir()) and not (work / _MARKER).exists():
        p.exit(2, f"{p.prog}: error: --work {work} exists and was not made by this script\n")
    if args.fresh:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    (work / _MARKER).write_text("made by bench.real_model\n")
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        handlers=[logging.StreamHandler(),
                                  logging.FileHandler(out / "real_model.log", "a")])
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = run(scale, out, work, args.until, args.curve)
    keys = ("train_samples", "tau_humaneval_pipeline", "tau_humaneval_reference",
            "tau_humaneval_reference_code", "tau_second_heldout", "greedy_distinct_4grams",
            "greedy_ended_share", "gpu_minutes")
    print(json.dumps({k: result.get(k) for k in keys}))
    missing = missing_figures(json.loads((work / "state.json").read_text())["done"], result)
    if missing:
        log.error("stages ran but gave no figure for: %s (see the logs in --out)",
                  ", ".join(missing))
        return 1
    return 0


# The figures each stage must leave; a stage whose subprocess failed records None instead.
_FIGURES = {"drafters": ("tau_humaneval_pipeline", "tau_humaneval_reference"),
            "export": ("tau_humaneval_reference_code", "tau_second_heldout")}


def missing_figures(done: list[str], result: dict) -> list[str]:
    """The figures the stages in ``done`` should have computed and did not."""
    missing = [key for stage in done for key in _FIGURES.get(stage, ())
               if result.get(key) is None]
    if "curve" in done:
        missing += [f"data_curve tau at {row['samples']} samples"
                    for row in result.get("data_curve", []) if row.get("tau") is None]
    return missing


if __name__ == "__main__":
    raise SystemExit(main())
