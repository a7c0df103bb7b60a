"""Plot docs/bench/h200_qwen3_8b_raw.json against its anchors -> docs/bench/h200_qwen3_8b.png.

    python -m bench.plot_8b        # needs matplotlib (not a project dependency)
"""

from __future__ import annotations

import json
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "bench"


def main() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = json.loads((DOCS / "h200_qwen3_8b_raw.json").read_text())
    bars = [
        ("drafter alone\n(compiled flex)", r["drafter_A_default"]["samples_per_s"], "C0"),
        ("target alone\neager", r["target_A_compile_False"]["samples_per_s"], "C1"),
        ("target alone\ncompiled", r["target_A_compile_True"]["samples_per_s"], "C1"),
        ("pipeline, 1 GPU\n(actors, CUDA IPC)", r["pipeline_A_one_gpu"]["samples_per_s"], "C2"),
        ("thread design, 1 GPU\n(eager, SDPA)", r["threads_A"]["samples_per_s"], "C7"),
    ]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    xs = range(len(bars))
    ax.bar(xs, [b[1] for b in bars], color=[b[2] for b in bars])
    for x, (_, v, _) in zip(xs, bars):
        ax.text(x, v + 0.8, f"{v:.1f}", ha="center")
    ax.axhline(7.2, ls="--", c="k", lw=1)
    ax.text(0.45, 7.6, "SpecForge trainer GPU: 7.2", ha="left", fontsize=8)
    ax.axhline(50.1 / 8, ls=":", c="k", lw=1)
    ax.text(0.45, 50.1 / 8 - 2.2, "SpecForge 8-GPU node / 8: 6.3", ha="left", fontsize=8)
    ax.set_xticks(list(xs), [b[0] for b in bars], fontsize=8)
    ax.set_ylabel("samples/s on one H200")
    ax.set_title("Qwen3-8B shape A (4 x 800 tokens, 256 anchors), torch 2.11, 2026-12-01")
    fig.tight_layout()
    fig.savefig(DOCS / "h200_qwen3_8b.png", dpi=110)


if __name__ == "__main__":
    main()
