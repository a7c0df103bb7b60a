"""A drafter that drafts on a real target, built from scratch (issues 10 and 25).

    # H200: two commands of ~9 minutes each (one GPU command may run 10), on the same machine
    python -m bench.quality_real_corpus --out $OUT --work /tmp/quality --until data
    python -m bench.quality_real_corpus --out $OUT --work /tmp/quality --resume
    python -m bench.quality_real_corpus --scale tiny --out /tmp/q_out --work /tmp/q    # CPU

Stages, each with a wall-clock budget (bench/quality/scale.py, which also says which stages
make up each GPU command); a stage over its budget is reported (``over_budget`` in
``stage_timings``), not stopped:
1. corpus: every Python source on the machine (the standard library and every installed
   package) and the help topics, split by a hash of the file's name (bench/quality/corpus.py);
   a byte-level BPE with ChatML and a mask token, trained on a subsample;
2. target: a Qwen3ForCausalLM (~90M parameters) trained from scratch on chat-formed code
   (user: a prefix, assistant: the rest), seeing its training tokens at most once; held-out
   and training-file losses reported (their ratio is the memorisation check); save_pretrained;
3. data: training-file and held-out-file prefixes answered greedily by the target through
   ``python -m pipeline.regenerate``; held-out prompts are used only for tau;
4. drafters: ``python -m pipeline.train`` (Ray, 1 GPU shared by target and drafter actors) and
   ``python -m pipeline.train_single`` with the same overrides (bench/quality/overrides.py),
   at the same time on the GPU; their metrics.jsonl give the curves and tau;
5. export: the pipeline's export loaded by ``AutoModel`` and decoded by a second decoder
   written apart from the evaluator (bench/quality/reference_decode.py), on the evaluator's
   prompts: ``tau_reference_code``.

``--resume`` goes on from the drafters in a ``--work`` that a ``--until data`` call left, and
its result file holds both calls' figures and timings (``calls``). Writes
``OUT/quality_real_corpus.json``, ``OUT/curves.png`` (and curves.json/.csv, all that
is written when matplotlib is missing), ``OUT/samples.jsonl`` (a few held-out prompts with the
target's answers) and the last lines of each subprocess log; large files stay in WORK.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import shutil
import time
from pathlib import Path

import torch

from bench.quality import proc, stages
from bench.quality.clock import StageClock
from bench.quality.plot import plot_curves
from bench.quality.scale import SCALES, Scale, get_scale

log = logging.getLogger("bench.quality")
_MARKER = ".quality_real_corpus"


def machine(scale: Scale) -> str:
    cores = len(os.sched_getaffinity(0))
    if scale.device == "cuda":
        return f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}, {cores} CPU cores"
    return f"CPU only ({platform.processor() or platform.machine()}), {cores} cores"


UNTIL = ("target", "data", "drafters")  # the stages a run may stop after
_TAUS = ("tau_pipeline", "tau_reference", "tau_reference_code")  # what a whole run measures
_STATE = "state.json"  # in WORK: the result so far (each call's wall in it) and the stages done


def run(scale: Scale, out: Path, work: Path, until: str = "drafters",
        resume: bool = False) -> dict:
    """The stages in order; with ``resume``, what a ``--until data`` call left in ``work``
    is taken as done and the run goes on from the drafters (one call per GPU command)."""
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    clock = StageClock(scale.hard_limit_factor, scale.run_limit_s)
    paths = stages.Paths(work)
    state = load_state(work) if resume else {"result": {}, "done": []}
    result: dict = state["result"]
    result.update({"scale": scale.name, "block_size": scale.block_size,
                   "date": datetime.date.today().isoformat(), "machine": machine(scale),
                   "versions": _versions()})
    result.pop("stopped_after", None)
    done: list[str] = state["done"]
    timings = result.setdefault("stage_timings", {})
    calls = result.setdefault("calls", [])
    budgets = scale.budgets()
    command = _command(scale, out, work, until, resume)
    try:
        if "data" not in done:
            with clock.stage("corpus", budgets["corpus"]):
                tokenizer, streams, result["corpus"] = stages.corpus_and_tokenizer(scale)
            done.append("corpus")
            with clock.stage("target", budgets["target"]):
                result.update(stages.target(scale, tokenizer, streams, paths))
            done.append("target")
            if until == "target":
                result["stopped_after"] = until
                return result
            with clock.stage("data", budgets["data"]):
                result.update(stages.data(scale, tokenizer, streams, paths, clock))
            done.append("data")
            if until == "data":
                result["stopped_after"] = until
                return result
            # One process running both calls' stages: the run limit is per GPU command.
            clock.new_call()
        _copy_samples(paths.heldout_data, out / "samples.jsonl", 4)
        with clock.stage("drafters", budgets["drafters"]):
            trainers = stages.drafters(scale, paths, clock)
        _add_drafter_figures(result, trainers, scale)
        with clock.stage("export", budgets["export"]):
            result.update(stages.export_tau(scale, paths))
        done.extend(["drafters", "export"])
        tau_p, tau_c = result.get("tau_pipeline"), result["tau_reference_code"]
        result["goals"]["export_tau_reproduced"] = bool(tau_p and abs(tau_c - tau_p) / tau_p
                                                        <= 0.05)
        result["plots"] = plot_curves({k: t.curves for k, t in trainers.items()},
                                      scale.block_size, out)
    finally:
        timings.update(clock.stages)
        wall = round(time.perf_counter() - started, 1)
        calls.append({"command": command, "wall_s": wall, "stages": list(clock.stages)})
        result["command"] = " && ".join(call["command"] for call in calls)
        result["over_budget"] = [n for n, t in timings.items() if t["over_budget"]]
        result["budget_policy"] = {"hard_limit_factor": scale.hard_limit_factor,
                                   "run_limit_s": scale.run_limit_s,
                                   "calls": [list(c) for c in scale.calls()]}
        result["total_wall_s"] = round(sum(call["wall_s"] for call in calls), 1)
        (work / _STATE).write_text(json.dumps(state, indent=2))
        _copy_log_tails(paths, out)
        (out / "quality_real_corpus.json").write_text(json.dumps(result, indent=2))
        log.info("wrote %s", out / "quality_real_corpus.json")
    return result


def load_state(work: Path) -> dict:
    """What an earlier ``--until data`` call left in ``work``; refuses anything less."""
    path = work / _STATE
    state = json.loads(path.read_text()) if path.exists() else None
    if state is None or "data" not in state["done"] or "drafters" in state["done"]:
        have = "nothing" if state is None else ", ".join(state["done"]) or "no stage"
        raise ResumeError(f"--resume needs --work {work} as a --until data call left it "
                          f"(corpus, target and data done, drafters not); it has {have} done")
    return state


class ResumeError(RuntimeError):
    pass


def _add_drafter_figures(result: dict, trainers: dict, scale: Scale) -> None:
    summary = stages.trainer_summary(trainers)
    tau_p, tau_r = summary["pipeline"]["final_tau"], summary["reference"]["final_tau"]
    walls = [t.wall_s for t in trainers.values()]
    result.update({
        "tau_pipeline": tau_p, "tau_reference": tau_r,
        "tau_relative_gap": (abs(tau_p - tau_r) / tau_r) if tau_p and tau_r else None,
        # Both trainers hold the one GPU at the same time: GPU minutes = the longer wall.
        "drafter_train_gpu_minutes": round((max(walls) if scale.concurrent_trainers
                                            else sum(walls)) / 60, 2),
        "trainers_concurrent": scale.concurrent_trainers, "trainers": summary,
        "goals": {"tau_at_least_3": bool(tau_p and tau_p >= 3.0),
                  "target_generalises": result.get("target_heldout_over_train", 99) <= 1.15,
                  "agree_within_5pct": bool(tau_p and tau_r
                                            and abs(tau_p - tau_r) / tau_r <= 0.05)}})
    log.info("tau pipeline %s, reference %s (block %d)", tau_p, tau_r, scale.block_size)


def _copy_samples(src: Path, dst: Path, n: int) -> None:
    """A few held-out prompts with the target's answers, to read what it writes."""
    with open(src) as f:
        dst.write_text("".join(line for _, line in zip(range(n), f)))


def _copy_log_tails(paths: stages.Paths, out: Path) -> None:
    logs = paths.work / "logs"
    for path in sorted(logs.glob("*.log")) if logs.exists() else []:
        (out / path.name).write_text(proc.tail(path, 200))


def _versions() -> dict:
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def _command(scale: Scale, out: Path, work: Path, until: str, resume: bool) -> str:
    tail = ("" if until == "drafters" else f" --until {until}") + (" --resume" if resume else "")
    return (f"python -m bench.quality_real_corpus --scale {scale.name} --out {out} "
            f"--work {work}{tail}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quality_real_corpus",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="small results: JSON, plot, log tails")
    p.add_argument("--work", default="/tmp/quality", help="large files: model, data, runs")
    p.add_argument("--scale", default="gpu", choices=sorted(SCALES))
    p.add_argument("--until", default="drafters", choices=UNTIL,
                   help="stop after this stage (target: the corpus and the target only)")
    p.add_argument("--resume", action="store_true",
                   help="go on from the drafters in a --work that a --until data call left "
                        "(the GPU scale's second command)")
    args = p.parse_args(argv)
    scale = get_scale(args.scale)
    if scale.device == "cuda" and not torch.cuda.is_available():
        p.exit(2, f"{p.prog}: error: --scale {scale.name} needs CUDA; use --scale tiny\n")
    if args.resume and args.until != "drafters":
        p.exit(2, f"{p.prog}: error: --resume runs the drafters; --until {args.until} "
                  "stops before them\n")
    out, work = Path(args.out).resolve(), Path(args.work).resolve()
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        handlers=[logging.StreamHandler(),
                                  logging.FileHandler(out / "quality_real_corpus.log", "w")])
    if work.exists() and any(work.iterdir()) and not (work / _MARKER).exists():
        p.exit(2, f"{p.prog}: error: --work {work} exists and was not made by this script; "
                  "give an empty or new directory\n")
    if not args.resume:
        # A fresh build: regenerate would resume old output.
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        (work / _MARKER).write_text("made by bench.quality_real_corpus; deleted on its next "
                                    "run without --resume\n")
    torch.set_float32_matmul_precision("high")
    try:
        result = run(scale, out, work, args.until, args.resume)
    except ResumeError as e:  # raised before any stage runs or any file is written
        p.exit(2, f"{p.prog}: error: {e}\n")
    print(json.dumps({k: result.get(k) for k in (
        "block_size", "target_params", "target_heldout_loss", "target_train_files_loss",
        "target_heldout_over_train", "target_epochs", "tau_pipeline", "tau_reference",
        "tau_reference_code",
        "drafter_train_gpu_minutes", "total_wall_s")}))
    missing = [k for k in _TAUS if "stopped_after" not in result and result.get(k) is None]
    if missing:
        log.error("no %s: the drafters ran but gave no tau (see their logs in --out)",
                  ", ".join(missing))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
