"""Plot the real-model bench's curves -> docs/bench/real_model_curve.png.

    python -m bench.plot_real_model                 # needs matplotlib (not a project dependency)
    python -m bench.plot_real_model --result OUT/real_model.json --png OUT/curve.png

Left: tau on HumanEval (block 16) against the training samples the drafter saw as distinct
samples, every point trained for the same epochs (older runs: the same steps); middle: the same
points against their GPU minutes (device share while training plus their share of the
regeneration), with the drafters stage's figures (the evaluator, the export decoded apart) at
the full set; right: tau along the drafters stage's training, both trainers. The data curve
comes from ``--curve-result`` when the result has none (a run without ``--curve``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "bench"


def curve_points(result: dict) -> list[tuple[int, float, float]]:
    """(samples, gpu_minutes, tau) of every data-curve row that has a tau, by samples."""
    rows = [r for r in result.get("data_curve", []) if r.get("tau") is not None]
    return sorted((int(r["samples"]), float(r["gpu_minutes"]), float(r["tau"])) for r in rows)


def plot(result: dict, png: Path, curve_result: dict | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = result if curve_points(result) else (curve_result or {})
    points = curve_points(curve)
    if not points:
        raise SystemExit("no data curve with tau in the result (run bench.real_model --curve)")
    samples, minutes, tau = zip(*points)
    fig, (left, right, along) = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
    for ax, xs, label in ((left, samples, "training samples (distinct)"),
                          (right, minutes, "GPU minutes (regeneration share + training)")):
        ax.plot(xs, tau, "o-", color="C0", label="reference trainer")
        for x, y in zip(xs, tau):
            ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(4, -12))
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    left.set_xscale("log", base=2)
    full = samples[-1]
    for key, marker, name in (("tau_humaneval_pipeline", "s", "pipeline (evaluator)"),
                              ("tau_humaneval_reference_code", "^", "export decoded apart")):
        if curve.get(key) is not None:
            left.plot([full], [curve[key]], marker, color="C1" if marker == "s" else "C2",
                      label=name)
    left.set_ylabel("tau on HumanEval, block 16")
    left.legend(loc="lower right", fontsize=8)
    left.set_title(_curve_budget(curve), fontsize=9)
    _along_training(along, result)
    target = result.get("target", {}).get("name", "target")
    fig.suptitle(f"SmolLM2-135M-Instruct ({target}): tau on HumanEval")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def _curve_budget(curve: dict) -> str:
    """What every curve point was trained for: epochs (this bench), or steps (older runs)."""
    if "data_curve_epochs" in curve:
        return f"data curve, {curve['data_curve_epochs']} epochs each"
    return f"data curve, {curve.get('data_curve_steps', '?')} steps of 32 each"


def _along_training(ax, result: dict) -> None:
    """tau at each evaluation of the drafters stage's two trainers, against the step."""
    trainers = result.get("trainers", {})
    for i, name in enumerate(("pipeline", "reference")):
        points = trainers.get(name, {}).get("tau_points") or []
        if points:
            steps, tau = zip(*points)
            ax.plot(steps, tau, "o-" if i == 0 else "x--", color=f"C{i + 1}", label=name)
    last = trainers.get("pipeline", {}).get("tau_points") or [[0, 1.0]]
    ax.annotate(f"{last[-1][1]:.2f}", tuple(last[-1]), textcoords="offset points",
                xytext=(-24, 6))
    samples = result.get("train_samples", "?")
    ax.set_title(f"along training, {samples} samples, "
                 f"{trainers.get('pipeline', {}).get('steps', '?')} steps", fontsize=9)
    ax.set_xlabel("training step")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.plot_real_model",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--result", type=Path, default=DOCS / "real_model.json")
    p.add_argument("--curve-result", type=Path, default=DOCS / "real_model_768steps.json",
                   help="the data curve's run, when --result has none")
    p.add_argument("--png", type=Path, default=DOCS / "real_model_curve.png")
    args = p.parse_args(argv)
    curve = (json.loads(args.curve_result.read_text()) if args.curve_result.exists()
             else None)
    plot(json.loads(args.result.read_text()), args.png, curve)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
