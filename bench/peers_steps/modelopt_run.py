"""ModelOpt's runs, from the bench's side: the spec for bench/peers_steps/modelopt_train.py (run
in the peers' environment), and its step and export lines read back."""

from __future__ import annotations

import dataclasses
import json
import shutil

from bench.peers_steps.common import Ctx, Point, steady_rates
from bench.peers_steps.runs import Run
from bench.peers_steps.samples import SampleSet
from bench.peers_steps.watch import Watched, python, run_watched

_STEP = r"^PEERSTEP (\{.*\})"
_EXPORT = r"^PEEREXPORT (\{.*\})"


def arch_overrides(ctx: Ctx) -> list[str]:
    """At our shape the draft's layer widths are the target's, as the pipeline's drafter has
    them; ModelOpt's default DFlash config keeps Qwen3Config's own defaults (32 heads of 128,
    an MLP of 22,016) whatever the target."""
    t = ctx.target_config()
    head_dim = t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]
    a = "dflash.dflash_architecture_config"
    return [f"{a}.num_attention_heads={t['num_attention_heads']}",
            f"{a}.num_key_value_heads={t['num_key_value_heads']}",
            f"{a}.head_dim={head_dim}", f"{a}.intermediate_size={t['intermediate_size']}"]


def spec(run: Run, ctx: Ctx) -> dict:
    over = list(run.overrides)
    if run.name.endswith("our_shape"):
        over += arch_overrides(ctx)
    return {"target": ctx.target, "train": str(ctx.work.data("train")),
            "sample_set": dataclasses.asdict(SampleSet.of(ctx.scale.data)),
            "out": str(ctx.run_dir(run)), "overrides": over,
            "marks": ctx.scale.mark_seconds, "max_steps": ctx.scale.max_steps}


def points(w: Watched) -> list[Point]:
    rows = [json.loads(m.group(1)) for _, m in w.all(_STEP)]
    return [Point(r["step"], r["time"], r["samples"], r["tokens"]) for r in rows]


def train(run: Run, ctx: Ctx) -> dict:
    run_dir = ctx.run_dir(run)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    spec_path, wanted = run_dir / "spec.json", spec(run, ctx)
    spec_path.write_text(json.dumps(wanted, indent=2))
    cmd = python("-m", "bench.peers_steps.modelopt_train", "--spec", str(spec_path))

    def first_step(w: Watched):
        hit = w.first(_STEP)
        return json.loads(hit[1].group(1))["time"] if hit else None

    budget = ctx.scale.budget_min * 60
    w = run_watched(run.name, cmd, ctx.work.log(run.name), ctx.peers_env, first_step,
                    budget, budget + ctx.scale.run_overhead_s * 3, stop_signal=None)
    marks = [None] * len(ctx.scale.mark_seconds)
    for _, m in w.all(_EXPORT):
        e = json.loads(m.group(1))
        out = ctx.export_dir(run, e["mark"])
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(e["dir"], out)
        marks[e["mark"]] = {"step": e["step"], "time": e["time"], "dir": str(out)}
    recipe = w.first(r"^PEERRECIPE (\{.*\})")
    return {"command": cmd, "spec": wanted, "watched": w, "points": points(w),
            "marks": marks, "resolved": json.loads(recipe[1].group(1)) if recipe else None}


def rates(result: dict) -> dict:
    return steady_rates(result["points"])


def recipe_summary(resolved: dict | None) -> dict:
    """What the result file keeps of the recipe as ModelOpt resolved it."""
    if not resolved:
        return {}
    d, t = resolved["dflash"], resolved["training"]
    keep = ("dflash_block_size", "dflash_num_anchors", "dflash_loss_objective",
            "dflash_dpace_alpha", "dflash_self_logit_distillation", "dflash_loss_decay_factor",
            "dflash_architecture_config", "dflash_mask_token_id")
    return {**{k: d.get(k) for k in keep},
            **{k: t.get(k) for k in ("learning_rate", "training_seq_len", "num_train_epochs",
                                     "per_device_train_batch_size", "warmup_steps",
                                     "lr_scheduler_type", "bf16")}}

