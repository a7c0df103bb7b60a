"""One variant of the embedded demo, trained by the single-process reference trainer.

The same step plan, init and objective as ``python -m pipeline.train`` (the reference matches
the pipeline's losses), in one process with one torch thread, and tau measured by the real
evaluator (``evaluate_tau``) on the held-out prompts at the chosen steps. Prints one JSON
line: the overrides, the tau at each eval point, the last loss and accuracy, and wall times.

    python -m bench.demo_sweep --evals 50,100,150 drafter.init=target_layers
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evals", default="", help="steps to measure tau after (0: untrained)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from pipeline.driver.compose import compose_job
    from pipeline.training.single import SingleProcessTrainer

    t0 = time.perf_counter()
    out = tempfile.mkdtemp(prefix="demo_sweep_")
    job = compose_job(list(args.overrides) + ["train.eval.every=-1", f"train.out_dir={out}"])
    trainer = SingleProcessTrainer(job)
    evals = sorted({int(s) for s in args.evals.split(",") if s})
    steps = len(trainer.plans)
    evals = [min(s, steps) for s in evals]
    taus, train_s, eval_s, row, train_s_at = {}, 0.0, 0.0, {}, {}
    if 0 in evals:
        t = time.perf_counter()
        taus[0] = round(trainer.evaluate_tau(), 4)
        eval_s += time.perf_counter() - t
    for step, plan in enumerate(trainer.plans, start=1):
        t = time.perf_counter()
        totals, _ = trainer.run_step(plan)
        train_s += time.perf_counter() - t
        if step in evals:
            from pipeline.training.metrics import metrics_dict

            row = metrics_dict(totals)
            train_s_at[step] = round(train_s, 2)
            t = time.perf_counter()
            taus[step] = round(trainer.evaluate_tau(), 4)
            eval_s += time.perf_counter() - t
    print(json.dumps({
        "name": args.name, "overrides": args.overrides, "steps": steps,
        "samples": len(trainer.dataset), "tau": taus,
        "loss": round(row.get("train/loss", float("nan")), 3),
        "accuracy": round(row.get("train/accuracy", float("nan")), 3),
        "train_s": round(train_s, 1), "train_s_at": train_s_at, "eval_s": round(eval_s, 1),
        "total_s": round(time.perf_counter() - t0, 1), "threads": args.threads,
        "load": os.getloadavg()[0]}), flush=True)


if __name__ == "__main__":
    main()
