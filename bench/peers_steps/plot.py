"""peers.png: tau against GPU minutes (from each trainer's launch), one line per trainer and
recipe, HumanEval on the left and the held-out explain set on the right. matplotlib may be
missing (the CPU venv): then only peers.json is written, which holds every point."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)
_COLOURS = {"ours": "C0", "modelopt": "C2", "speculators": "C3"}


def series(result: dict, key: str) -> dict[str, list[tuple[float, float]]]:
    """Run name -> [(GPU minutes, tau)] of the marks that were decoded."""
    out = {}
    for name, row in result.get("runs", {}).items():
        pts = [(m["gpu_min"], m[key]) for m in row.get("marks", [])
               if m.get(key) is not None and m.get("gpu_min") is not None]
        if pts:
            out[name] = sorted(pts)
    return out


def plot(result: dict, png: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: %s not drawn (peers.json has the points)",
                    png.name)
        return False
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    styles = ["-", "--", ":", "-."]
    for ax, key, title in ((axes[0], "tau_humaneval", "HumanEval"),
                           (axes[1], "tau_explain", "held-out explain prompts")):
        seen: dict[str, int] = {}
        for name, pts in series(result, key).items():
            trainer = result["runs"][name]["trainer"]
            i = seen[trainer] = seen.get(trainer, -1) + 1
            x, y = zip(*pts)
            ax.plot(x, y, styles[i % len(styles)], marker="o",
                    color=_COLOURS.get(trainer, "C7"), label=name)
        ax.set(title=f"tau, {title}", xlabel="GPU minutes from launch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{result.get('target', {}).get('name', '')} on {result.get('device_name')}: "
                 f"each trainer alone, {result.get('budget_min')} min of training", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True
