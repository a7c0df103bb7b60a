"""The drafter recipe on the quality bench's target: each knob as tau against training time
(issue 25 item 3).

    python -m bench.quality_sweep --out docs/bench/quality_sweep --work /tmp/sweep    # 1x H200
    python -m bench.quality_sweep --scale tiny --variants base,gamma_4 \\
        --out /tmp/s_out --work /tmp/s_work                                          # CPU

First the corpus, the target and its regenerated data, as ``bench.quality_real_corpus``
builds them (``--until data``); then every variant is trained by the single-process
reference trainer (``bench.demo_sweep``: the pipeline's losses in one process) from the same
overrides as the bench's drafters (bench/quality/overrides.py) plus its own, ``--concurrent``
variants at a time on the one GPU, and tau is measured by the evaluator after the steps in
``--evals``. Variants sharing the GPU slow each other: their seconds compare variants of one
sweep, not GPU-minutes of a run alone.

Writes ``OUT/quality_sweep.json`` (per variant: its overrides, ``tau`` and ``train_s_at`` per
eval step) and, where matplotlib is installed, ``OUT/quality_sweep.png``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench.quality.overrides import trainer_overrides
from bench.quality.scale import SCALES, Scale, get_scale

# Each knob the issue names, one step away from the bench's recipe (bench/quality/scale.py
# GPU: 3 layers from the target's last 3, block 16, 192 anchors, lr 1.5e-3, cosine, gamma 1,
# micro-batch 32). The drafter's width is the target's hidden size by construction (it shares
# the target's embedding and LM head), so depth is the size knob. Entries starting with "--"
# are demo_sweep's own flags (the schedule), the rest are config overrides.
VARIANTS: dict[str, tuple[str, ...]] = {
    "base": (),
    # Fewer only: answers are at most 192 tokens, so more than the base's 192 anchors would
    # add padded anchors (static shapes) and no supervised block.
    "anchors_low": ("drafter.num_anchors=64",),
    "gamma_4": ("drafter.gamma=4.0",),
    "gamma_7": ("drafter.gamma=7.0",),  # DFlash's rule for block 16
    "lr_low": ("train.optim.lr=6e-4",),
    "lr_high": ("train.optim.lr=4e-3",),
    "schedule_wsd": ("--schedule=wsd",),
    "layers_1": ("drafter.num_layers=1",),
    "layers_5": ("drafter.num_layers=5",),
    "init_random": ("drafter.init=random",),
    "batch_16": ("data.micro_batch_size=16",),
    "batch_64": ("data.micro_batch_size=64",),
    "batch_64_lr_3e-3": ("data.micro_batch_size=64", "train.optim.lr=3e-3"),
}
# Set by demo_sweep itself (evaluations at --evals, a temporary out_dir).
_OWN_KEYS = ("train.eval.every=", "train.out_dir=")


def variant_command(scale: Scale, work: Path, name: str, evals: str,
                    max_train_s: float = 0.0, steps: int = 0) -> list[str]:
    from bench.quality.stages import Paths

    paths = Paths(work)
    base = [o for o in trainer_overrides(scale, str(paths.target), str(paths.train_data),
                                         str(paths.heldout_data), "unused")
            if not o.startswith(_OWN_KEYS)]
    if steps:  # the same shorter plan for every variant, before the variant's own keys
        base = [o for o in base if not o.startswith("train.plan.max_steps=")]
        base.append(f"train.plan.max_steps={steps}")
    return [sys.executable, "-m", "bench.demo_sweep", "--evals", evals, "--threads", "2",
            "--max-train-s", str(max_train_s), "--name", name, *base, *VARIANTS[name]]


def sweep(scale: Scale, work: Path, out: Path, names: list[str], evals: str,
          concurrent: int, max_train_s: float = 0.0, steps: int = 0) -> dict:
    result: dict = {"scale": scale.name, "evals": evals, "concurrent": concurrent,
                    "max_train_s": max_train_s, "steps": steps or scale.max_steps,
                    "variants": {}}
    path = out / "quality_sweep.json"
    for start in range(0, len(names), concurrent):
        batch = names[start:start + concurrent]
        procs = {}
        for name in batch:
            # stdout to a file, not a pipe: a sweep stopped from outside keeps each
            # variant's progress lines.
            with open(out / f"sweep_{name}.log", "w") as log, \
                    open(out / f"sweep_{name}.jsonl", "w") as lines:
                procs[name] = subprocess.Popen(
                    variant_command(scale, work, name, evals, max_train_s, steps),
                    stdout=lines, stderr=log, text=True)
        for name, proc in procs.items():
            proc.wait()
            text = (out / f"sweep_{name}.jsonl").read_text()
            final = [line for line in text.splitlines()
                     if line.startswith("{") and '"progress"' not in line]
            result["variants"][name] = (json.loads(final[-1]) if proc.returncode == 0 and final
                                        else {"error": f"exit {proc.returncode}: see "
                                                       f"sweep_{name}.log"})
            print(f"[sweep] {name}: {json.dumps(result['variants'][name])}", flush=True)
        path.write_text(json.dumps(result, indent=2))
    return result


def plot(result: dict, out: Path) -> str | None:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, run in result["variants"].items():
        if "tau" not in run:
            continue
        steps = sorted(run["tau"], key=int)
        xs = [run["train_s_at"].get(s, 0.0) / 60 for s in steps]
        ax.plot(xs, [run["tau"][s] for s in steps], marker="o",
                linewidth=2.5 if name == "base" else 1.2, label=name)
    ax.set_xlabel("training minutes (variants sharing the GPU)")
    ax.set_ylabel("tau (held-out prompts)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "quality_sweep.png"
    fig.savefig(path, dpi=120)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    import bench.quality_real_corpus as bench

    p = argparse.ArgumentParser(prog="python -m bench.quality_sweep",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--work", default="/tmp/quality_sweep")
    p.add_argument("--scale", default="gpu", choices=sorted(SCALES))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--evals", default="150,300,600", help="steps to measure tau after")
    p.add_argument("--concurrent", type=int, default=5)
    p.add_argument("--steps", type=int, default=0,
                   help="train.plan.max_steps for every variant (0: the bench's)")
    p.add_argument("--max-train-s", type=float, default=0.0,
                   help="each variant stops training after this many seconds (0: never)")
    p.add_argument("--skip-build", action="store_true",
                   help="reuse the target and data already in --work")
    args = p.parse_args(argv)
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"--variants: {unknown} not in {list(VARIANTS)}")
    out, work = Path(args.out).resolve(), Path(args.work).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.skip_build:
        bench.main(["--scale", args.scale, "--out", str(out), "--work", str(work),
                    "--until", "data"])
    result = sweep(get_scale(args.scale), work, out, names, args.evals, args.concurrent,
                   args.max_train_s, args.steps)
    result["plot"] = plot(result, out)
    (out / "quality_sweep.json").write_text(json.dumps(result, indent=2))
    failed = [n for n, r in result["variants"].items() if "error" in r]
    if failed:
        raise SystemExit(f"bench.quality_sweep: {', '.join(failed)} failed; see their logs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
