"""curves.png (loss, per-position accuracy, tau against step, both trainers), or its data.

matplotlib may be missing on the GPU machine: then the same series go to curves.json and
curves.csv, to plot elsewhere.
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

from bench.quality.runs import Curves

log = logging.getLogger(__name__)

_STYLE = {"pipeline": ("-", "C0"), "reference": ("--", "C1")}  # line style, colour


def write_curve_data(curves: dict[str, Curves], out: Path) -> list[str]:
    (out / "curves.json").write_text(json.dumps({k: c.to_json() for k, c in curves.items()}))
    with open(out / "curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trainer", "step", "loss", "accuracy", "expected_tau", "eval_tau"])
        for name, c in curves.items():
            taus = dict(zip(c.tau_steps, c.tau))
            for i, step in enumerate(c.steps):
                w.writerow([name, step, c.loss[i], c.accuracy[i], c.expected_tau[i],
                            taus.pop(step, "")])
            for step, tau in sorted(taus.items()):  # eval rows without a train row (step 0)
                w.writerow([name, step, "", "", "", tau])
    return ["curves.json", "curves.csv"]


def plot_curves(curves: dict[str, Curves], block_size: int, out: Path) -> list[str]:
    written = write_curve_data(curves, out)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: wrote the curve data only (%s)", written)
        return written
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    positions = sorted({1, 2, 4, 8, block_size - 1})
    for name, c in curves.items():
        ls, color = _STYLE.get(name, (":", "C2"))
        axes[0, 0].plot(c.steps, c.loss, ls, color=color, label=name)
        for i, k in enumerate(positions):  # colour: the position; line style: the trainer
            if c.position_accuracy and k <= len(c.position_accuracy[0]):
                axes[0, 1].plot(c.steps, [r[k - 1] for r in c.position_accuracy], ls,
                                color=f"C{i + 2}", label=f"{name} pos {k}")
        final = c.final_position_accuracy()
        axes[1, 0].plot(range(1, len(final) + 1), final, ls, color=color, marker="o",
                        label=name)
        axes[1, 1].plot(c.steps, c.expected_tau, ls, color=color, alpha=0.4,
                        label=f"{name}: from train accuracies")
        axes[1, 1].plot(c.tau_steps, c.tau, ls, color=color, marker="s",
                        label=f"{name}: eval/tau, held-out prompts")
    axes[0, 0].set(title="drafter loss", xlabel="step", yscale="log")
    axes[0, 1].set(title="accuracy at block positions", xlabel="step")
    axes[1, 0].set(title="per-position accuracy (mean of last 20 steps)",
                   xlabel="block position")
    axes[1, 1].set(title=f"tau (block {block_size})", xlabel="step")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    plt.close(fig)
    return ["curves.png", *written]
