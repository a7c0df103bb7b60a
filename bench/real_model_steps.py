"""The stages of bench/real_model.py; each returns the figures it adds to the result file.

The machinery is bench/quality's: subprocesses with budgets (proc.py), the trainers' curves
(runs.py) and the export's second decoder (reference_decode.py).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.quality import proc
from bench.quality.runs import read_pipeline, read_single
from bench.real_model_prompts import write_prompt_files
from bench.real_model_scale import RealScale, trainer_overrides

log = logging.getLogger(__name__)

STAGES = ("convert", "prompts", "data", "drafters", "export", "reference", "recipes")
# What a user runs to get a drafter: regeneration, training, evaluation (the 20-minute
# chain). The reference trainer, its data curve and the recipes check and explore beside it.
CHAIN = ("convert", "prompts", "data", "drafters", "export")
SETS = ("train", "humaneval", "explain")  # the regenerated sets, in regen input order
CURVE_FRACTIONS = (16, 8, 4)  # the curve's smaller sizes: N/16, N/8, N/4 (and N: 16x in all)


@dataclass(frozen=True)
class Work:
    root: Path

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def data(self, name: str) -> Path:
        return self.root / "data" / f"{name}.jsonl"

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def run_dir(self, name: str) -> Path:
        return self.root / "runs" / name


def run_stage(stage: str, scale: RealScale, w: Work, result: dict) -> dict:
    log.info("=== %s", stage)
    # Every subprocess converts (or finds) the GGUF in the same cache as this process.
    os.environ.setdefault("DFLASH_GGUF_CACHE", str(w.path("gguf_cache")))
    return {"convert": convert, "prompts": prompts, "data": data, "drafters": drafters,
            "export": export, "reference": reference, "recipes": recipes}[stage](scale, w, result)


def gguf_path(scale: RealScale, w: Work) -> str:
    return scale.gguf or str(w.path("tiny-llama.gguf"))


def convert(scale: RealScale, w: Work, result: dict) -> dict:
    from pipeline.assets.gguf import gguf_folder

    source = gguf_path(scale, w)
    if scale.gguf is None:  # the tiny scale: a tiny Llama written as SmolLM2's file is
        from pipeline.assets.tiny_gguf import write_tiny_gguf

        write_tiny_gguf(source)
    folder = gguf_folder(source)
    manifest = json.loads(Path(folder, "gguf_source.json").read_text())
    config = json.loads(Path(folder, "config.json").read_text())
    return {"target_folder": folder, "target": {
        "name": Path(source).name, "source": source, "sha256": manifest["sha256"],
        "parameters": manifest["parameters"], "model_type": config["model_type"],
        "layers": config["num_hidden_layers"], "hidden_size": config["hidden_size"]}}


def prompts(scale: RealScale, w: Work, result: dict) -> dict:
    """All prompts of the machine's APIs, then seeded samples of the sizes asked, written
    as one regenerate input: training, HumanEval, held-out explain prompts in that order."""
    if scale.prompts_dir:  # built on another machine (its installed packages), copied as is
        shutil.copytree(scale.prompts_dir, w.path("prompts"), dirs_exist_ok=True)
        stats = json.loads(w.path("prompts", "prompts_stats.json").read_text())
        stats["built_elsewhere"] = str(scale.prompts_dir)
    else:
        stats = write_prompt_files(w.path("prompts"), scale.heldout_fraction,
                                   packages=scale.packages, humaneval=scale.humaneval,
                                   seed=scale.seed, max_corpus_chars=scale.max_corpus_chars)
    rng = random.Random(scale.seed)
    picked = {}
    for name, file, n in (("train", "train", scale.train_prompts),
                          ("humaneval", "humaneval", scale.humaneval_prompts),
                          ("explain", "heldout_explain", scale.heldout_prompts)):
        lines = w.path("prompts", f"{file}.jsonl").read_text().splitlines()
        picked[name] = lines[:n] if name == "humaneval" else rng.sample(lines, min(n, len(lines)))
    empty = [name for name in SETS if not picked[name]]
    if empty:  # a set without prompts would give no figure: say which and why, now
        raise RuntimeError(f"no {' or '.join(empty)} prompts to sample ({stats['prompts']} "
                           f"prompts in all): raise max_corpus_chars or heldout_fraction")
    regen_input = w.data("regen_input")
    regen_input.parent.mkdir(parents=True, exist_ok=True)
    with open(regen_input, "w") as f:
        for name in SETS:
            for line in picked[name]:
                f.write(line + "\n")  # prompts-only: regenerate appends the answer
    counts = {name: len(picked[name]) for name in SETS}
    log.info("prompts: %s of %s", counts, {k: stats[k] for k in ("prompts",)})
    return {"prompts": stats, "prompt_counts": counts}


def data(scale: RealScale, w: Work, result: dict) -> dict:
    out = w.data("regenerated")
    out.unlink(missing_ok=True)  # else regenerate would resume into it
    finished = proc.run("regenerate", [
        "-m", "pipeline.regenerate", "--input", str(w.data("regen_input")),
        "--output", str(out), "--target", gguf_path(scale, w), "--device", scale.device,
        "--batch-size", str(scale.regen_batch_size), "--static-rows", str(scale.regen_rows),
        "--static-attention", scale.regen_attention,
        "--max-new-tokens", str(scale.max_new_tokens), "--num-workers", "1",
        "--cpus-per-worker", "1"], w.log("regenerate"), scale.regen_budget_s,
        3 * scale.regen_budget_s)
    if finished.returncode != 0:
        raise RuntimeError(f"pipeline.regenerate failed (exit {finished.returncode}); see "
                           f"{finished.log_path}")
    counts = result["prompt_counts"]
    bounds, start = {}, 0
    for name in SETS:
        bounds[name] = (start, start + counts[name])
        start += counts[name]
    answers = {name: [] for name in SETS}
    sinks = {name: open(w.data(name), "w") for name in SETS}
    try:
        for line in out.read_text().splitlines():
            record = json.loads(line)
            name = next(n for n, (a, b) in bounds.items() if a <= record["source_line"] < b)
            sinks[name].write(line + "\n")
            answers[name].append(record)
    finally:
        for f in sinks.values():
            f.close()
    greedy = {name: _greedy_stats(result["target_folder"], records)
              for name, records in answers.items()}
    everything = _pooled(greedy.values())
    log.info("greedy answers: %s", greedy)
    return {"train_samples": len(answers["train"]), "greedy": greedy,
            "greedy_distinct_4grams": everything["distinct_4grams"],
            "greedy_ended_share": everything["ended_share"],
            "regenerate": finished.report()}


def _greedy_stats(target_folder: str, records: list[dict]) -> dict:
    from transformers import AutoTokenizer

    from pipeline.assets.chat_data import answer_stats
    from pipeline.assets.generate import Continuation

    tokenizer = AutoTokenizer.from_pretrained(target_folder)
    texts = [next(m["content"] for m in r["messages"] if m["role"] == "assistant")
             for r in records]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    answers = [Continuation(i, all(r["regen"]["finished"])) for i, r in zip(ids, records)]
    stats = answer_stats(tokenizer, answers)
    stats["ended_share"] = round(stats["ended_turn"] / max(1, len(answers)), 3)
    stats["answers"] = len(answers)
    return stats


def _pooled(sets) -> dict:
    """The stats of every answer from each set's (answer-weighted means; no second pass)."""
    sets = list(sets)
    n = sum(s["answers"] for s in sets)
    mean = lambda key: sum(s[key] * s["answers"] for s in sets) / max(1, n)  # noqa: E731
    return {"answers": n, "ended_share": round(sum(s["ended_turn"] for s in sets) / max(1, n), 3),
            "distinct_4grams": round(mean("distinct_4grams"), 3),
            "mean_assistant_tokens": round(mean("mean_assistant_tokens"), 1)}


def _trainer(name: str, module: str, scale: RealScale, w: Work, train: Path,
             max_steps: int | None = None, budget_s: float | None = None,
             recipe: tuple[str, ...] = (), sharing: int = 1) -> proc.Job:
    """``sharing``: the trainers started to run at once (they split the host's cores)."""
    shutil.rmtree(w.run_dir(name), ignore_errors=True)  # train afresh, never resume
    args = ["-m", module, "--config-name", "smollm2_135m", *trainer_overrides(
        scale, gguf_path(scale, w), str(train), str(w.data("humaneval")),
        str(w.run_dir(name)), max_steps, recipe)]
    budget = budget_s or scale.train_budget_s
    return proc.start(name, args, w.log(name), budget, 3 * budget, sharing)


def _run_summary(c, finished: proc.Finished) -> dict:
    """What the result file keeps of one trainer's run: tau along it, its end, its budget."""
    return {"tau_points": list(zip(c.tau_steps, c.tau)), "steps": c.steps[-1] if c.steps else 0,
            "final_loss": c.loss[-1] if c.loss else None,
            "final_position_accuracy": [round(a, 4) for a in c.final_position_accuracy()],
            **finished.report()}


def drafters(scale: RealScale, w: Work, result: dict) -> dict:
    """The pipeline's run alone on the device: its wall is the chain's training time."""
    finished = proc.wait(_trainer("pipeline", "pipeline.train", scale, w, w.data("train")))
    c = read_pipeline(w.run_dir("pipeline"))
    return {"tau_humaneval_pipeline": c.final_tau, "pipeline_wall_s": round(finished.wall_s, 1),
            "trainers": {**result.get("trainers", {}), "pipeline": _run_summary(c, finished)}}


def export(scale: RealScale, w: Work, result: dict) -> dict:
    """The pipeline's export decoded apart, on HumanEval and on the held-out explain set."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    from bench.quality.reference_decode import acceptance, decode
    from pipeline.eval.tau import heldout_prompts

    folder, export_dir = result["target_folder"], w.run_dir("pipeline") / "export"
    if not (export_dir / "config.json").exists():
        raise RuntimeError(f"no export at {export_dir}: the pipeline run did not finish")
    dtype = torch.bfloat16 if scale.device == "cuda" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(folder)
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(scale.device).eval()
    draft = AutoModel.from_pretrained(str(export_dir), trust_remote_code=True, dtype=dtype)
    draft = draft.to(scale.device).eval()
    figures = {}
    for name in ("humaneval", "explain"):
        ids = heldout_prompts(str(w.data(name)), tokenizer, scale.eval_prompts)
        decoded = [decode(target, draft, p, scale.eval_max_new_tokens, tokenizer.eos_token_id)
                   for p in ids]
        figures[name] = acceptance(decoded, scale.block_size)
    log.info("export decoded apart: %s", figures)
    return {"tau_humaneval_reference_code": figures["humaneval"]["tau"],
            "tau_second_heldout": figures["explain"]["tau"],
            "tau_per_position": {k: v["accepted_at_position"] for k, v in figures.items()},
            "second_heldout": "held-out modules' explain prompts (bench/real_model_prompts.py)"}


def recipes(scale: RealScale, w: Work, result: dict) -> dict:
    """The reference trainer once per ``--recipe`` not yet measured, all at once on the
    device, each with the drafters stage's overrides plus its own, tau every
    ``eval_every`` steps, on the first ``recipe_samples`` answers (default: all). A recipe's
    GPU minutes are its device share (wall / runs sharing it). What they compare with: the
    reference stage's run on all answers, the data curve's run of the same size, or else a
    run without overrides (``base``) trained beside them."""
    done = dict(result.get("recipes", {}))
    todo = [(name, over) for name, over in scale.recipes if name not in done]
    if not todo:
        return {"recipes": done}
    lines = w.data("train").read_text().splitlines()
    n = scale.recipe_samples or len(lines)
    if not 1 <= n <= len(lines):
        raise ValueError(f"--recipe-samples {n}: the training set holds {len(lines)} answers")
    train = w.data("train") if n == len(lines) else _subset(w, lines, n)
    if BASE not in done and _base_tau(result, n, len(lines)) is None:
        todo.append((BASE, ()))
    jobs = {name: _trainer(f"recipe_{name}", "pipeline.train_single", scale, w, train,
                           budget_s=scale.train_budget_s * len(todo), recipe=over,
                           sharing=len(todo))
            for name, over in todo}
    for (name, over), job in zip(todo, jobs.values()):
        finished = proc.wait(job)
        c = read_single(w.run_dir(f"recipe_{name}"), finished.log_path)
        done[name] = {"overrides": list(over), "samples": n, "tau": c.final_tau,
                      **_run_summary(c, finished), "sharing_device": len(jobs),
                      "gpu_minutes": round(finished.wall_s / 60 / len(jobs), 2)}
        log.info("recipe %s (%s): tau %s", name, " ".join(over) or "no overrides", c.final_tau)
    base = _base_tau(result, n, len(lines))
    if base is not None and BASE not in done:
        done[BASE] = {"overrides": [], "samples": n, "tau": base, "from": "reference or curve"}
    return {"recipes": done}


BASE = "base"  # the recipes' comparison run, without overrides


def _base_tau(result: dict, n: int, total: int):
    """tau of a run already made on ``n`` answers with no recipe's overrides, if any."""
    if n == total and result.get("tau_humaneval_reference") is not None:
        return result["tau_humaneval_reference"]
    row = next((r for r in result.get("data_curve", []) if r["samples"] == n), None)
    return None if row is None else row["tau"]


def _subset(w: Work, lines: list[str], n: int) -> Path:
    """The first ``n`` training answers as a file of their own (the curve's too)."""
    subset = w.data(f"train_{n}")
    subset.write_text("\n".join(lines[:n]) + "\n")
    return subset


def curve_sizes(total: int, curve: bool) -> list[int]:
    """The reference's training-set sizes: ``total``, and with the curve total/16, /8, /4."""
    return [max(1, round(total / k)) for k in (CURVE_FRACTIONS if curve else ())] + [total]


def reference(scale: RealScale, w: Work, result: dict) -> dict:
    """The single-process reference trainer with the pipeline's overrides on the full set, and
    (``--curve``) on the first N/16, N/8 and N/4 of it, all at once on the device: the same
    epochs each (at most the same steps), so a smaller set takes fewer steps.

    A data-curve point's GPU minutes are its share of the device while it trained (wall / runs
    sharing it) plus its share of the regeneration (n / N of the data stage's minutes)."""
    lines = w.data("train").read_text().splitlines()
    regen_minutes = result.get("gpu_minutes", {}).get("data", 0.0)
    jobs = {}
    # Once per size: on a tiny set two fractions round to the same size, and a second trainer
    # in the same run folder would leave the first running unwatched.
    sizes = list(dict.fromkeys(curve_sizes(len(lines), scale.curve)))
    for n in sizes:
        if n == len(lines):
            name, subset = "reference", w.data("train")
        else:
            name, subset = f"curve_{n}", _subset(w, lines, n)
        jobs[n] = (name, _trainer(name, "pipeline.train_single", scale, w, subset,
                                  budget_s=scale.train_budget_s * (2 if scale.curve else 1),
                                  sharing=len(sizes)))
    rows, figures = [], {}
    for n, (name, job) in jobs.items():
        done = proc.wait(job)
        c = read_single(w.run_dir(name), done.log_path)
        rows.append({"samples": n, "tau": c.final_tau, "steps": c.steps[-1] if c.steps else 0,
                     "wall_minutes": round(done.wall_s / 60, 2), "sharing_device": len(jobs),
                     "gpu_minutes": round(done.wall_s / 60 / len(jobs)
                                          + regen_minutes * n / len(lines), 2)})
        if name == "reference":
            figures = {"tau_humaneval_reference": c.final_tau,
                       "reference_wall_s": round(done.wall_s, 1),
                       "trainers": {**result.get("trainers", {}),
                                    "reference": _run_summary(c, done)}}
    log.info("reference runs: %s", rows)
    if scale.curve:
        figures.update(data_curve=rows, data_curve_epochs=scale.epochs)
    return figures
