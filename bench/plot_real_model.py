"""Plot the real-model bench's data curve -> docs/bench/real_model_curve.png.

    python -m bench.plot_real_model                 # needs matplotlib (not a project dependency)
    python -m bench.plot_real_model --result OUT/real_model.json --png OUT/curve.png

Left: tau on HumanEval (block 16) against the training samples the drafter saw as distinct
samples, every point trained for the same steps (smaller sets for more epochs); right: the same
points against their GPU minutes (device share while training plus their share of the
regeneration), with the drafters stage's three figures (the evaluator, the reference trainer,
the export decoded apart) at the full set.
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


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = curve_points(result)
    if not points:
        raise SystemExit("no data curve with tau in the result (run bench.real_model --curve)")
    samples, minutes, tau = zip(*points)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
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
        if result.get(key) is not None:
            left.plot([full], [result[key]], marker, color="C1" if marker == "s" else "C2",
                      label=name)
    left.set_ylabel("tau on HumanEval, block 16")
    left.legend(loc="lower right", fontsize=8)
    target = result.get("target", {}).get("name", "target")
    fig.suptitle(f"SmolLM2-135M-Instruct ({target}): tau against data, "
                 f"{result.get('data_curve_steps', '?')} steps of 32 samples each")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.plot_real_model",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--result", type=Path, default=DOCS / "real_model.json")
    p.add_argument("--png", type=Path, default=DOCS / "real_model_curve.png")
    args = p.parse_args(argv)
    plot(json.loads(args.result.read_text()), args.png)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
