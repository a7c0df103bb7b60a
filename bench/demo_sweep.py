"""One variant of the embedded demo, trained by the single-process reference trainer.

The same step plan, init and objective as ``python -m pipeline.train`` (the reference matches
the pipeline's losses), in one process with one torch thread, and tau measured by the real
evaluator (``evaluate_tau``) on the held-out prompts at the chosen steps. Prints one JSON
line: the overrides, the tau at each eval point, the last loss and accuracy, and wall times.

    python -m bench.demo_sweep --evals 50,100,150 drafter.init=target_layers

``--schedule wsd`` swaps the trainer's warmup+cosine for warmup-stable-decay here, in the
bench, so that the schedule is measured before the pipeline offers it. ``--max-train-s``
ends training early (tau is then measured at the step reached), so that variants sharing a
machine fit one command's time.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


def wsd_factor(step: int, total_steps: int, warmup_ratio: float, min_lr_ratio: float,
               decay_ratio: float = 0.2) -> float:
    """Multiplier of the base lr: linear warmup, constant, linear decay over the last
    ``decay_ratio`` of the steps down to ``min_lr_ratio``."""
    warmup = max(1, round(total_steps * warmup_ratio)) if warmup_ratio > 0 else 0
    if step < warmup:
        return (step + 1) / warmup
    decay = max(1, round(total_steps * decay_ratio))
    left = total_steps - step
    if left >= decay:
        return 1.0
    return min_lr_ratio + (1 - min_lr_ratio) * max(0, left) / decay


def use_wsd(trainer, total_steps: int) -> None:
    optim = trainer.drafter.optim
    scheduler = trainer.drafter.scheduler
    scheduler.lr_lambdas = [lambda s: wsd_factor(s, total_steps, optim.warmup_ratio,
                                                 optim.min_lr_ratio)
                            for _ in scheduler.lr_lambdas]
    for group, factor in zip(trainer.drafter.optimizer.param_groups, scheduler.lr_lambdas):
        group["lr"] = optim.lr * factor(scheduler.last_epoch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evals", default="", help="steps to measure tau after (0: untrained)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="")
    parser.add_argument("--schedule", default="cosine", choices=("cosine", "wsd"))
    parser.add_argument("--max-train-s", type=float, default=0.0,
                        help="stop training after this many seconds of steps (0: never)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from pipeline.driver.compose import compose_job
    from pipeline.training.metrics import metrics_dict
    from pipeline.reference.trainer import SingleProcessTrainer

    t0 = time.perf_counter()
    out = tempfile.mkdtemp(prefix="demo_sweep_")
    job = compose_job(list(args.overrides) + ["train.eval.every=-1", f"train.out_dir={out}"])
    trainer = SingleProcessTrainer(job)
    steps = len(trainer.plans)
    if args.schedule == "wsd":
        use_wsd(trainer, trainer.drafter.total_steps)
    evals = sorted({min(int(s), steps) for s in args.evals.split(",") if s})
    taus, train_s, eval_s, row, train_s_at, done = {}, 0.0, 0.0, {}, {}, 0

    def measure(step: int) -> None:
        nonlocal eval_s
        t = time.perf_counter()
        taus[step] = round(trainer.evaluate_tau(), 4)
        eval_s += time.perf_counter() - t
        # A progress line per eval: a run stopped from outside still leaves its points.
        print(json.dumps({"name": args.name, "progress": step, "tau": taus[step],
                          "train_s": round(train_s, 2)}), flush=True)

    if 0 in evals:
        measure(0)
    for step, plan in enumerate(trainer.plans, start=1):
        t = time.perf_counter()
        totals, _ = trainer.run_step(plan)
        train_s += time.perf_counter() - t
        done = step
        out_of_time = 0 < args.max_train_s <= train_s
        if step in evals or out_of_time:
            row = metrics_dict(totals)
            train_s_at[step] = round(train_s, 2)
            measure(step)
        if out_of_time:
            break
    print(json.dumps({
        "name": args.name, "overrides": args.overrides, "schedule": args.schedule,
        "steps": steps, "steps_done": done, "stopped_early": done < steps,
        "samples": len(trainer.dataset), "tau": taus,
        "loss": round(row.get("train/loss", float("nan")), 3),
        "accuracy": round(row.get("train/accuracy", float("nan")), 3),
        "train_s": round(train_s, 1), "train_s_at": train_s_at, "eval_s": round(eval_s, 1),
        "total_s": round(time.perf_counter() - t0, 1), "threads": args.threads,
        "load": os.getloadavg()[0]}), flush=True)


if __name__ == "__main__":
    main()
