"""Plot bench.lengths' rates -> docs/bench/h200_lengths.png.

    python -m bench.plot_lengths    # needs matplotlib (not a project dependency)

Samples/s of each way to batch the mix, beside the two ideals (full rows' tokens/s
and full rows' anchor blocks/s, each spread over the mix's mean sample).
"""

from __future__ import annotations

import json
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "bench"
BARS = (("padded", "padded_samples_per_s", "C7"), ("bucket", "bucket_samples_per_s", "C0"),
        ("pack", "pack_samples_per_s", "C2"),
        ("anchor ideal", "anchor_ideal_samples_per_s", "C1"),
        ("token ideal", "ideal_samples_per_s", "C3"))


def bars(result: dict) -> list[tuple[str, float, str]]:
    """(label, samples/s, colour) of every rate the JSON has (a missing one is left out)."""
    return [(label, result[key], colour) for label, key, colour in BARS
            if result.get(key) is not None]


def main() -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = json.loads((DOCS / "h200_lengths.json").read_text())
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    rows = bars(result)
    xs = range(len(rows))
    ax.bar(xs, [r for _, r, _ in rows], color=[c for _, _, c in rows])
    for x, (_, rate, _) in zip(xs, rows):
        ax.text(x, rate, f"{rate:.1f}", ha="center", va="bottom")
    ax.set_xticks(list(xs), [label for label, _, _ in rows])
    ax.set_ylabel("samples/s")
    mean = result["distribution"]["measured_tokens"]["mean"]
    ax.set_title(f"Qwen3-8B shape, one H200 co-located; Nemotron-like mix (mean {mean:.0f} "
                 f"tokens, {result['mean_anchors']:.0f} anchors)", fontsize=9)
    fig.tight_layout()
    out = DOCS / "h200_lengths.png"
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
