"""The four stages of the benchmark; each returns the figures it adds to the result file.

Everything large (tokenizer, target, data, drafter runs) is written under the work
directory; only small logs are copied to the output directory by the caller.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.quality import proc
from bench.quality.clock import StageClock
from bench.quality.corpus import load_corpus
from bench.quality.overrides import trainer_overrides
from bench.quality.prompts import write_prompts
from bench.quality.runs import Curves, read_pipeline, read_single
from bench.quality.scale import Scale
from bench.quality.target import ChatWindows, heldout_loss, train
from bench.quality.tokens import encode_stream, train_tokenizer
from pipeline.assets.chat_data import answer_stats
from pipeline.assets.generate import Continuation
from pipeline.assets.target import build_target

log = logging.getLogger(__name__)
_REPO = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class Paths:
    work: Path

    @property
    def target(self) -> Path:
        return self.work / "target"

    @property
    def prompts(self) -> Path:
        return self.work / "data" / "prompts.jsonl"

    @property
    def regenerated(self) -> Path:
        return self.work / "data" / "regenerated.jsonl"

    @property
    def train_data(self) -> Path:
        return self.work / "data" / "train.jsonl"

    @property
    def heldout_data(self) -> Path:
        return self.work / "data" / "heldout.jsonl"

    def run_dir(self, trainer: str) -> Path:
        return self.work / "runs" / trainer

    def log(self, name: str) -> Path:
        return self.work / "logs" / f"{name}.log"


def corpus_and_tokenizer(scale: Scale) -> tuple[object, dict[str, torch.Tensor], dict]:
    # This repository is on sys.path too; it is not an installed package.
    corpus = load_corpus(scale.heldout_fraction, scale.max_corpus_chars, exclude=(_REPO,))
    tokenizer = train_tokenizer(corpus, scale.vocab_size, scale.tokenizer_sample_chars,
                                scale.seed)
    streams = {"train": encode_stream(tokenizer, corpus.train),
               "heldout": encode_stream(tokenizer, corpus.heldout)}
    stats = {**corpus.stats(), "vocab_size": len(tokenizer),
             "mask_token_id": tokenizer.mask_token_id,
             "train_tokens": len(streams["train"]), "heldout_tokens": len(streams["heldout"])}
    log.info("corpus: %s", stats)
    return tokenizer, streams, stats


def target(scale: Scale, tokenizer, streams: dict[str, torch.Tensor], paths: Paths) -> dict:
    torch.manual_seed(scale.seed)
    model = build_target(scale, tokenizer)
    run = train(model, ChatWindows(tokenizer, streams["train"], scale, scale.seed), scale)
    loss = heldout_loss(model, ChatWindows(tokenizer, streams["heldout"], scale,
                                           scale.seed + 1), scale)
    # The same measure on training files: the gap says how much the target memorised.
    train_loss = heldout_loss(model, ChatWindows(tokenizer, streams["train"], scale,
                                                 scale.seed + 1), scale)
    log.info("target: %d params, %d steps (%.0f s, %.1fM tokens), held-out loss %.3f "
             "nats/token (training files %.3f)", run.params, run.steps, run.train_s,
             run.tokens_seen / 1e6, loss, train_loss)
    model.save_pretrained(paths.target)
    tokenizer.save_pretrained(paths.target)
    del model
    torch.compiler.reset()  # compiled code must not keep the model alive on the GPU
    if scale.device == "cuda":
        torch.cuda.empty_cache()
    return {"target_params": run.params, "target_heldout_loss": round(loss, 4),
            "target_train_files_loss": round(train_loss, 4),
            "target_heldout_over_train": round(loss / train_loss, 3),
            "target_epochs": round(run.tokens_seen / len(streams["train"]), 3),
            "target_train": {"steps": run.steps,
                             "train_s": round(run.train_s, 1),
                             "tokens_seen": run.tokens_seen,
                             "final_train_loss": run.losses[-1][1] if run.losses else None,
                             "loss_curve": run.losses}}


def data(scale: Scale, tokenizer, streams: dict[str, torch.Tensor], paths: Paths,
         clock: StageClock) -> dict:
    """One regenerate call answers training prompts then held-out ones; split afterwards."""
    n_train = write_prompts(str(paths.prompts), tokenizer, streams["train"],
                            scale.num_train_prompts, scale.prompt_tokens, scale.seed + 2)
    heldout_in = paths.prompts.with_name("heldout_prompts.jsonl")
    write_prompts(str(heldout_in), tokenizer, streams["heldout"], scale.num_heldout_prompts,
                  scale.prompt_tokens, scale.seed + 3)
    with open(paths.prompts, "a") as f:
        f.write(heldout_in.read_text())
    paths.regenerated.unlink(missing_ok=True)  # else regenerate would resume into it
    finished = proc.run("regenerate", [
        "-m", "pipeline.regenerate", "--input", str(paths.prompts),
        "--output", str(paths.regenerated), "--target", str(paths.target),
        "--device", scale.device, "--batch-size", str(scale.regen_batch_size),
        "--max-new-tokens", str(scale.max_new_tokens), "--num-workers", "1",
        "--cpus-per-worker", "1"], paths.log("regenerate"), scale.regen_budget_s,
        clock.hard_limit_s(scale.regen_budget_s))
    if finished.returncode != 0:
        why = (f"stopped at its hard limit of {finished.limit_s:.0f} s (budget "
               f"{finished.budget_s:.0f} s; raise regen_budget_s in bench/quality/scale.py)"
               if finished.stopped else f"failed (exit {finished.returncode})")
        raise RuntimeError(f"pipeline.regenerate {why}; see {finished.log_path}")
    stats = _split_regenerated(paths, n_train)
    # How repetitive the target's answers are: what a drafter can exploit.
    stats["heldout_answers"] = _answer_stats(tokenizer, paths.heldout_data)
    log.info("data: %s", stats)
    return {"data": stats, "regenerate_wall_s": round(finished.wall_s, 1),
            "regenerate": finished.report()}


def _split_regenerated(paths: Paths, n_train: int) -> dict:
    counts = {"train": 0, "heldout": 0}
    tokens = {"train": 0, "heldout": 0}
    finished = {"train": 0, "heldout": 0}
    with open(paths.regenerated) as src, open(paths.train_data, "w") as tr, \
            open(paths.heldout_data, "w") as ho:
        for line in src:
            record = json.loads(line)
            split = "train" if record["source_line"] < n_train else "heldout"
            (tr if split == "train" else ho).write(line)
            counts[split] += 1
            tokens[split] += sum(record["regen"]["num_tokens"])
            finished[split] += all(record["regen"]["finished"])
    return {split: {"conversations": counts[split],
                    "mean_answer_tokens": round(tokens[split] / max(1, counts[split]), 1),
                    "ended_turn": finished[split]} for split in counts}


def _answer_stats(tokenizer, path: Path) -> dict:
    answers = []
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            text = next(m["content"] for m in record["messages"] if m["role"] == "assistant")
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            answers.append(Continuation(ids, all(record["regen"]["finished"])))
    return answer_stats(tokenizer, answers)


@dataclass
class TrainerResult:
    curves: Curves
    run: proc.Finished

    @property
    def wall_s(self) -> float:
        return self.run.wall_s


def drafters(scale: Scale, paths: Paths, clock: StageClock) -> dict[str, TrainerResult]:
    """``pipeline.train`` and ``pipeline.train_single`` on the same data, config and steps."""
    modules = {"pipeline": "pipeline.train", "reference": "pipeline.train_single"}
    jobs = {}
    for name, module in modules.items():
        # A rerun must train afresh: pipeline.train would otherwise resume the finished run
        # (train.checkpoint.resume=auto), train nothing, and leave the old metrics to be read.
        shutil.rmtree(paths.run_dir(name), ignore_errors=True)
        args = ["-m", module, *trainer_overrides(
            scale, str(paths.target), str(paths.train_data), str(paths.heldout_data),
            str(paths.run_dir(name)))]
        jobs[name] = proc.start(name, args, paths.log(name), scale.train_budget_s,
                                clock.hard_limit_s(scale.train_budget_s),
                                len(modules) if scale.concurrent_trainers else 1)
        if not scale.concurrent_trainers:
            jobs[name] = proc.wait(jobs[name])
    results = {}
    for name, job in jobs.items():
        done = job if isinstance(job, proc.Finished) else proc.wait(job)
        run_dir = paths.run_dir(name)
        curves = (read_pipeline(run_dir) if name == "pipeline"
                  else read_single(run_dir, done.log_path))
        results[name] = TrainerResult(curves, done)
        log.info("%s: %d steps logged, tau %s, exit %s in %.0f s", name, len(curves.steps),
                 list(zip(curves.tau_steps, [round(t, 3) for t in curves.tau])),
                 done.returncode, done.wall_s)
    return results


def export_tau(scale: Scale, paths: Paths) -> dict:
    """The pipeline's export decoded by the bench's second decoder (reference_decode.py) on
    the evaluator's prompts and settings: ``tau_reference_code``."""
    from bench.quality.reference_decode import export_tau as decode_tau

    export = paths.run_dir("pipeline") / "export"
    if not (export / "config.json").exists():
        raise RuntimeError(f"no export at {export}: the pipeline run did not finish")
    dtype = torch.bfloat16 if scale.device == "cuda" else torch.float32  # target.dtype=auto
    value = decode_tau(str(paths.target), str(export), str(paths.heldout_data),
                       scale.eval_prompts, scale.eval_max_new_tokens, scale.device, dtype)
    log.info("export: tau %.3f decoded by AutoModel with its own cache", value)
    return {"tau_reference_code": round(value, 4)}


def trainer_summary(results: dict[str, TrainerResult]) -> dict:
    return {name: {"final_tau": r.curves.final_tau, "tau_points": list(zip(r.curves.tau_steps,
                                                                              r.curves.tau)),
                   "steps": r.curves.steps[-1] if r.curves.steps else 0,
                   "final_loss": r.curves.loss[-1] if r.curves.loss else None,
                   "final_position_accuracy": [round(a, 4) for a in
                                               r.curves.final_position_accuracy()],
                   "returncode": r.run.returncode,
                   **r.run.report()} for name, r in results.items()}
