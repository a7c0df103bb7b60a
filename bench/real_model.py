"""A drafter for a real pretrained model, SmolLM2-135M-Instruct from its GGUF file (issue 33).

    # H200: one command (~24 GPU-minutes; sizes are flags, see bench/real_model_scale.py),
    # run in the background and polled over device calls; a second call resumes it.
    python -m bench.real_model --out docs/bench --work /tmp/real --prompts PROMPTS --curve
    python -m bench.real_model --scale tiny --out /tmp/r_out --work /tmp/r_work  # CPU, minutes

Stages, each resumable (``WORK/state.json`` records those done; a call runs the ones not done,
up to ``--until``). The first five are the chain a user runs (its GPU minutes are the
issue's budget); the others check and explore beside it:
1. convert: the GGUF file into a cached HF folder (pipeline/assets/gguf.py), as ``target.path``
   does in every trainer;
2. prompts: prompts-only chat lines about every documented API on the machine, split by source
   module (bench/real_model_prompts.py), and HumanEval's prompts;
3. data: training, HumanEval and held-out ``explain`` prompts answered greedily by the target
   in one ``python -m pipeline.regenerate`` call; the answers' distinct 4-grams and the share
   that ended their turn;
4. drafters: ``python -m pipeline.train --config-name smollm2_135m`` alone on the device, tau
   on HumanEval from its evaluator along the way;
5. export: the pipeline's export decoded apart (bench/quality/reference_decode.py) on HumanEval
   and on the held-out explain prompts, with acceptance per block position;
6. reference: ``python -m pipeline.train_single`` with the same overrides, and with
   ``--curve`` the data curve: the same trainer on N/16, N/8 and N/4 of the answers, all at
   once on the device;
7. recipes (``--recipe NAME KEY=VALUE ...``, repeatable): the reference trainer once per
   variant of the drafters stage's overrides, all at once on the device, tau along the way;
   never marked done: a later call trains only the names not yet measured. With
   ``--recipe-samples N`` they train on the first N answers (cheaper: the same epochs), beside
   a run without overrides (``base``) unless the data curve has one of that size.

``--redo STAGE...`` runs stages again that state.json has done, e.g. after the device machine
that held ``--work`` was given back: copy state.json (and the marker file) into a fresh
``--work`` and run ``--redo convert prompts data`` to make the target folder and the answers
again; the drafters and export stages stay done and the reference trains on the new answers.

``--set KEY=VALUE`` (repeatable) changes every trainer's overrides (the drafters stage's, the
reference's, the curve's, the recipes'), e.g. ``--set drafter.gamma=2``.

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
from bench.real_model_steps import BASE, CHAIN, STAGES, Work, run_stage

log = logging.getLogger("bench.real_model")
_MARKER = ".real_model"


def run(scale: RealScale, out: Path, work: Path, until: str, redo: tuple = ()) -> dict:
    """The stages not yet done (or named in ``redo``), in order, up to ``until``; the result
    so far is kept."""
    state_path = work / "state.json"
    state = (json.loads(state_path.read_text()) if state_path.exists()
             else {"done": [], "result": {"gpu_minutes": {}}})
    again = [s for s in state["done"] if s in redo]
    if again:  # their files are gone (another machine) or stale: their figures are replaced
        log.info("running again, as asked: %s", ", ".join(again))
        state["done"] = [s for s in state["done"] if s not in redo]
    result = state["result"]
    result.update({"scale": scale.name, "device": scale.device})
    w = Work(work)
    # recipes: never marked done; each call trains the --recipe names not yet measured.
    wanted = [s for s in STAGES if s != "recipes" or scale.recipes]
    stop = wanted.index(until) + 1 if until in wanted else len(wanted)
    try:
        for stage in wanted[:stop]:
            if stage in state["done"]:
                continue
            started = time.perf_counter()
            result.update(run_stage(stage, scale, w, result))
            minutes = (time.perf_counter() - started) / 60
            # Every stage holds the device machine, CPU-bound ones too: its wall counts.
            result["gpu_minutes"][stage] = round(
                minutes + (result["gpu_minutes"].get(stage, 0) if stage == "recipes" else 0), 2)
            if stage != "recipes":
                state["done"].append(stage)
            state_path.write_text(json.dumps(state, indent=2))
    finally:
        minutes = result["gpu_minutes"]
        minutes["chain"] = round(sum(minutes.get(k, 0) for k in CHAIN), 2)
        minutes["total"] = round(sum(v for k, v in minutes.items()
                                     if k not in ("chain", "total")), 2)
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
               ("num-anchors", int), ("lr", float), ("train-budget-s", float),
               ("regen-batch-size", int), ("regen-rows", int), ("regen-attention", str),
               ("recipe-samples", int))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.real_model",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="small results: real_model.json, log tails")
    p.add_argument("--work", default="/tmp/real_model", help="large files: target, data, runs")
    p.add_argument("--scale", default="h200", choices=sorted(SCALES))
    p.add_argument("--until", choices=STAGES,
                   help="stop after this stage (default: the last one given work: recipes "
                        "with --recipe, else reference)")
    p.add_argument("--curve", action="store_true",
                   help="the reference stage also trains on N/16, N/8, N/4 (the data curve)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override for every trainer (repeatable; replaces the bench's own "
                        "value of that key)")
    p.add_argument("--recipe", action="append", nargs="+", default=[],
                   metavar="NAME KEY=VALUE",
                   help="a variant for the recipes stage: a name, then its overrides "
                        "(repeatable); the reference trainer runs every new one at once")
    p.add_argument("--fresh", action="store_true", help="empty --work first")
    p.add_argument("--redo", nargs="+", choices=STAGES, default=[], metavar="STAGE",
                   help="run these stages again although state.json has them done (their "
                        "files were lost with another machine); later stages done stay done")
    p.add_argument("--gguf", help="the target's GGUF file (default: the scale's)")
    p.add_argument("--humaneval", help="HumanEval.jsonl(.gz) (default: the scale's)")
    p.add_argument("--prompts", help="a folder written by python -m bench.real_model_prompts "
                   "(on another machine, say) used instead of walking this one's packages")
    for flag, kind in _SIZE_FLAGS:
        p.add_argument(f"--{flag}", type=kind, help="override the scale's value")
    args = p.parse_args(argv)
    if args.until == "recipes" and not args.recipe:
        p.error("--until recipes: give at least one --recipe NAME KEY=VALUE")
    args.until = args.until or ("recipes" if args.recipe else "reference")
    sizes = {flag.replace("-", "_"): getattr(args, flag.replace("-", "_"))
             for flag, _ in _SIZE_FLAGS}
    scale = SCALES[args.scale].with_sizes(
        gguf=args.gguf, humaneval=args.humaneval, prompts_dir=args.prompts,
        extra=tuple(_overrides(p, "--set", args.set)), recipes=_recipes(p, args.recipe),
        curve=args.curve or None, **sizes)
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
    result = run(scale, out, work, args.until, tuple(args.redo))
    keys = ("train_samples", "tau_humaneval_pipeline", "tau_humaneval_reference",
            "tau_humaneval_reference_code", "tau_second_heldout", "greedy_distinct_4grams",
            "greedy_ended_share", "gpu_minutes")
    recipes = {name: row["tau"] for name, row in result.get("recipes", {}).items()}
    print(json.dumps({**{k: result.get(k) for k in keys}, **({"recipes": recipes}
                                                               if recipes else {})}))
    missing = missing_figures(json.loads((work / "state.json").read_text())["done"], result)
    if missing:
        log.error("stages ran but gave no figure for: %s (see the logs in --out)",
                  ", ".join(missing))
        return 1
    return 0


def _overrides(p: argparse.ArgumentParser, flag: str, items: list[str]) -> list[str]:
    for item in items:
        if "=" not in item or item.startswith("="):
            p.error(f"{flag} {item}: want KEY=VALUE")
    return items


def _recipes(p: argparse.ArgumentParser, given: list[list[str]]) -> tuple:
    """``--recipe NAME KEY=VALUE ...`` as ((name, overrides), ...), names unique and plain
    (each names a run folder)."""
    recipes = []
    for name, *over in given:
        if not name.replace("_", "").replace("-", "").isalnum():
            p.error(f"--recipe {name}: a name of letters, digits, '-' and '_' comes first")
        if not over:
            p.error(f"--recipe {name}: give at least one KEY=VALUE after the name")
        if name in [n for n, _ in recipes]:
            p.error(f"--recipe {name}: given twice")
        if name == BASE:
            p.error(f"--recipe {name}: reserved for the run without overrides the others "
                    "compare with")
        recipes.append((name, tuple(_overrides(p, f"--recipe {name}", over))))
    return tuple(recipes)


# The figures each stage must leave; a stage whose subprocess failed records None instead.
_FIGURES = {"drafters": ("tau_humaneval_pipeline",),
            "export": ("tau_humaneval_reference_code", "tau_second_heldout"),
            "reference": ("tau_humaneval_reference",)}


def missing_figures(done: list[str], result: dict) -> list[str]:
    """The figures the stages in ``done`` should have computed and did not."""
    missing = [key for stage in done for key in _FIGURES.get(stage, ())
               if result.get(key) is None]
    missing += [f"tau of recipe {name}" for name, row in result.get("recipes", {}).items()
                if row.get("tau") is None]
    if "reference" in done:
        missing += [f"data_curve tau at {row['samples']} samples"
                    for row in result.get("data_curve", []) if row.get("tau") is None]
    return missing


if __name__ == "__main__":
    raise SystemExit(main())
