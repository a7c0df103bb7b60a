"""Side by side with the peer trainers (issue 71): the pipeline, NVIDIA ModelOpt and vLLM
Speculators on the same target, data and GPU, for the same minutes.

    # One GPU, two device commands of under 10 minutes (the second goes on from the first; on a
    # fresh machine it also takes the first's --out through --from). The peers' wheels travel
    # in .devbundle (launch/peers_bundle.sh).
    python -m bench.peers --scale gpu --out OUT --work /tmp/peers --stop-after-min 9
    python -m bench.peers --scale gpu --out OUT2 --work /tmp/peers --resume --from OUT \
        --stop-after-min 9
    python -m bench.peers --scale tiny --out /tmp/p_out --work /tmp/p_work   # CPU, minutes
    python -m bench.peers --scale tiny --device cuda --out OUT --work /tmp/p_work  # GPU smoke

1. data, once: bench/real_model.py's convert, prompts and data stages (SmolLM2-135M-Instruct
   from its GGUF, its own greedy answers, HumanEval's prompts and the held-out explain set);
2. each run of bench/peers_steps/runs.py alone on the device: trained for ``--budget-min``
   minutes after its first step, checkpoints at the marks (1/3, 2/3 and all of the budget),
   each exported to z-lab's format (a peer's own exporter, or bench/peers_steps/zlab.py's
   inverse of speculators' converter) and decoded by the one decoder
   (bench/quality/reference_decode.py) on HumanEval and the held-out set, with the lossless
   check against the target's greedy decoding;
3. ``OUT/peers.json`` (every figure, command and version), ``OUT/peers.png``, and
   ``OUT/peers.md`` (the table and the goals, bench/peers_steps/table.py).

The peers run from their PyPI wheels in an environment beside the project's
(bench/peers_steps/env.py). A peer that cannot run on this machine is skipped with its reason,
which the result file keeps (speculators' trainer needs CUDA). Their deviations from their
own recipes, each needed to compare at all, are listed under ``notes`` in the result file.

Resumable like bench/real_model.py: ``WORK/state.json`` keeps the data stages and every run
done; a call trains the runs not yet done and, with ``--stop-after-min``, starts none that
would end past that minute (a device command may run 10). ``--from DIR`` seeds an empty
``--work`` from an earlier call's ``--out`` (its peers.json and peers_data.tar.gz): the same
answers on a fresh machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tarfile
import time
from pathlib import Path

from bench.peers_steps import env as peers_env_mod
from bench.peers_steps.common import Ctx
from bench.peers_steps.plot import plot
from bench.peers_steps.race import race
from bench.peers_steps.runs import runs, select
from bench.peers_steps.samples import SampleSet, encoded_samples
from bench.peers_steps.scale import SCALES
from bench.peers_steps.table import markdown
from bench.real_model_steps import Work, run_stage

log = logging.getLogger("bench.peers")
DATA_STAGES = ("convert", "prompts", "data")
_MARKER = ".peers"
_DATA_FILES = ("train", "humaneval", "explain")
NOTES = [
    "Each trainer alone on the device; budget = training minutes after its first step; "
    "gpu_min of a mark = minutes from the trainer's launch (start-up included).",
    "Same samples for all: the pipeline's sample set (its ChatDataset: tokenization, loss "
    "masks, at least two blocks supervised within its max_length), each cut to the trainer's "
    "sequence length, feeds ModelOpt's Trainer and speculators' prepare-data "
    "(bench/peers_steps/samples.py); trained_samples counts it.",
    "ModelOpt: its dflash.yaml recipe through its Python API and transformers.Trainer; the "
    "mask token pinned to the pipeline's (SmolLM2 has none); our shape also gives the draft "
    "the target's layer widths (its default DFlash config keeps Qwen3Config's 32 heads of 128 "
    "and MLP 22,016, see draft.parameters).",
    "Speculators: its data generator needs a vLLM server, so its hidden-state files are written "
    "in its file format from our target (bench/peers_steps/speculators_hs.py); every draft "
    "layer full attention (--full-attention-indices): its default sliding layers are causal "
    "inside a block, which z-lab's format and the one decoder do not serve; "
    "--train-data-ratio 0.99 (it refuses 1.0).",
    "Schedules: the pipeline plans ours_epochs passes (its cosine about fits the budget); the "
    "peers keep their recipes' epochs (ModelOpt 10, speculators 20), so the budget cuts their "
    "schedules early (training.num_train_epochs=N or --epochs=N in a run's overrides changes "
    "that).",
    "Speculators' checkpoints are converted to z-lab's format by the inverse of its converter "
    "(bench/peers_steps/zlab.py), checked against its converter in the unit tests.",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="peers.json, peers.png, peers.md, the data tarball (required "
                   "but with --install-peers)")
    p.add_argument("--work", default="/tmp/peers", help="large files: target, data, runs")
    p.add_argument("--scale", default="gpu", choices=sorted(SCALES))
    p.add_argument("--budget-min", type=float, help="training minutes per run (scale's)")
    p.add_argument("--until", choices=("data", "runs"), default="runs")
    p.add_argument("--resume", action="store_true", help="go on from --work's state.json")
    p.add_argument("--from", dest="seed", help="an earlier --out to seed an empty --work")
    p.add_argument("--runs", nargs="+", help="only these runs (default: all)")
    p.add_argument("--device", choices=("cpu", "cuda"),
                   help="every stage and trainer on this device (default: the scale's; tiny "
                   "on cuda tries each peer's GPU path in minutes)")
    p.add_argument("--gguf", help="the target's GGUF file (default: the scale's)")
    p.add_argument("--humaneval", help="HumanEval.jsonl(.gz) (default: the scale's; tiny: a "
                   "stand-in of four tasks in its form where that file is absent)")
    p.add_argument("--prompts", help="a folder of python -m bench.real_model_prompts, used "
                   "instead of walking this machine's packages")
    p.add_argument("--stop-after-min", type=float,
                   help="start no run that would end past this many minutes of this call")
    p.add_argument("--install-peers", action="store_true",
                   help="only install the peers beside the venv (bench/peers_steps/env.py)")
    p.add_argument("--no-install", action="store_true",
                   help="never install the peers (skip them where they do not import)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.install_peers:
        _, why = peers_env_mod.peers_env(allow_install=True)
        print(why or "the peers import")
        return 0 if why is None else 1
    if args.out is None:
        p.error("the following arguments are required: --out")
    scale = SCALES[args.scale].with_sizes(budget_min=args.budget_min,
                                         stop_after_min=args.stop_after_min)
    if (args.device or scale.data.device) == "cuda" and not _has_cuda():
        hint = "--device cpu" if args.device else "--device cpu, or --scale tiny"
        p.exit(2, f"{p.prog}: error: --scale {scale.name}"
                  f"{' --device cuda' if args.device else ''} runs on CUDA, and this machine has "
                  f"no CUDA device: {hint}\n")
    out, work = Path(args.out).resolve(), Path(args.work).resolve()
    if work.exists() and any(work.iterdir()) and not (work / _MARKER).exists():
        p.exit(2, f"{p.prog}: error: --work {work} exists and was not made by this script\n")
    if work.exists() and (work / "state.json").exists() and not args.resume:
        p.exit(2, f"{p.prog}: error: --work {work} holds a run: add --resume, or another "
                  "--work\n")
    try:
        chosen = select(runs(scale), args.runs)
    except ValueError as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    work.mkdir(parents=True, exist_ok=True)
    (work / _MARKER).write_text("made by bench.peers\n")
    humaneval = args.humaneval
    if humaneval is None and scale.name == "tiny" and not Path(scale.data.humaneval).exists():
        humaneval = str(_stand_in_humaneval(work))
    scale = scale.with_sizes(data=scale.data.with_sizes(
        gguf=args.gguf, humaneval=humaneval, prompts_dir=args.prompts, device=args.device,
        cluster_device=args.device))
    out.mkdir(parents=True, exist_ok=True)
    logging.getLogger().addHandler(logging.FileHandler(out / "peers.log", "a"))
    return run(scale, chosen, out, Work(work), args)


def run(scale, chosen, out: Path, w: Work, args) -> int:
    started = time.time()
    state = _load_state(w, args.seed)
    result = state["result"]
    result.update({"scale": scale.name, "budget_min": scale.budget_min,
                   "marks": list(scale.marks), "notes": NOTES})
    os.environ.setdefault("DFLASH_GGUF_CACHE", str(w.path("gguf_cache")))
    try:
        for stage in DATA_STAGES:  # convert always: the target folder lives in this --work
            if stage in state["done"] and (stage != "convert" or
                                           Path(result.get("target_folder", "")).exists()):
                continue
            result.update(run_stage(stage, scale.data, w, result))
            if stage not in state["done"]:
                state["done"].append(stage)
            _save(w, state)
        _data_tarball(w, out)
        if args.until == "data":
            return 0
        device = scale.data.device
        penv, missing = peers_env_mod.peers_env(allow_install=not args.no_install)
        result.update(device=device, device_name=_device_name(device),
                      versions=peers_env_mod.versions(penv), peers_missing=missing)
        ctx = Ctx(scale, w, result, penv, missing, device)
        result.update(_sample_set(ctx))
        mean_tokens = result["mean_tokens"]
        left = []
        for r in chosen:
            if r.name in state["runs"]:
                continue
            spent = time.time() - started
            need = scale.budget_min * 60 + scale.run_overhead_s
            if scale.stop_after_min and spent + need > scale.stop_after_min * 60:
                left.append(r.name)
                continue
            log.info("=== %s (%s)", r.name, r.recipe)
            state["runs"][r.name] = race(r, ctx, mean_tokens)
            _save(w, state)
        if left:
            log.info("left for the next call (--resume): %s", " ".join(left))
        result["left_for_next_call"] = left
    finally:
        result["runs"] = state["runs"]
        _save(w, state)
        (out / "peers.json").write_text(json.dumps(result, indent=2, default=str))
        (out / "peers.md").write_text(markdown(result))
        if result.get("runs"):
            plot(result, out / "peers.png")
    print(json.dumps({n: {k: r.get(k) for k in ("status", "tau_humaneval", "tau_explain",
                                                 "samples_per_s", "reason")}
                      for n, r in result["runs"].items()}, indent=1))
    failed = [n for n, r in result["runs"].items() if r.get("status") == "failed"]
    return 1 if failed else 0


def _stand_in_humaneval(work: Path) -> Path:
    """Four tasks in HumanEval's form (the tiny scale, where the package's file is absent)."""
    import gzip

    path = work / "HumanEval_stand_in.jsonl.gz"
    work.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for name in ("add", "sub", "mul", "div"):
            f.write(json.dumps({"prompt": f"def {name}(a, b):\n    \"\"\"{name} a and b."
                                          f"\"\"\"\n"}) + "\n")
    return path


def _load_state(w: Work, seed: str | None) -> dict:
    path = w.path("state.json")
    if path.exists():
        return json.loads(path.read_text())
    state = {"done": [], "runs": {}, "result": {}}
    if seed:  # an earlier call's --out: its answers and the runs it finished
        seed_dir = Path(seed)
        with tarfile.open(seed_dir / "peers_data.tar.gz") as tar:
            tar.extractall(w.path("data"), filter="data")
        earlier = json.loads((seed_dir / "peers.json").read_text())
        keep = ("prompts", "prompt_counts", "train_samples", "greedy", "greedy_distinct_4grams",
                "greedy_ended_share", "regenerate", "target")
        state["result"] = {k: earlier[k] for k in keep if k in earlier}
        state["runs"] = earlier.get("runs", {})
        state["done"] = ["prompts", "data"]  # convert runs again: its folder is per machine
        log.info("seeded %s from %s: %d runs done", w.root, seed, len(state["runs"]))
    return state


def _save(w: Work, state: dict) -> None:
    w.path("state.json").write_text(json.dumps(state, indent=2, default=str))


def _data_tarball(w: Work, out: Path) -> None:
    """The answers and the evaluation sets, for a later call on another machine (--from)."""
    with tarfile.open(out / "peers_data.tar.gz", "w:gz") as tar:
        for name in _DATA_FILES:
            tar.add(w.data(name), arcname=f"{name}.jsonl")


def _sample_set(ctx: Ctx) -> dict:
    """The samples every trainer trains on (bench/peers_steps/samples.py): how many, and their
    mean tokens as the pipeline cuts them (speculators' samples/s come from its tokens/s)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ctx.target)
    rows = encoded_samples(tok, str(ctx.work.data("train")), ctx.scale.data.max_length,
                           SampleSet.of(ctx.scale.data))
    lens = [len(r["input_ids"]) for r in rows]
    return {"trained_samples": len(rows), "mean_tokens": sum(lens) / max(1, len(lens))}


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() \
        else "cpu"


if __name__ == "__main__":
    raise SystemExit(main())
