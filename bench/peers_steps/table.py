"""peers.md: the result file as a markdown table (one row per run) and the goals read from it:
each of the pipeline's runs against the best peer, for samples/s (goal: 2x) and for tau on both
held-out sets (goal: at least the best peer's). What the README's table and BENCHMARKS quote.

    python -m bench.peers_steps.table OUT/peers.json      # prints it
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

_COLUMNS = ("run", "samples/s", "target tokens/s", "first step (s)", "peak GPU (MiB)",
            "tau HumanEval", "tau explain")
SPEED_GOAL = 2.0  # our steady samples/s over the best peer's


def _cell(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def rows(result: dict) -> list[list[str]]:
    out = []
    for name, row in result.get("runs", {}).items():
        if row.get("status") != "ok":
            out.append([name, f"{row.get('status', '?')}: {row.get('reason', '')}"[:90]]
                       + [""] * (len(_COLUMNS) - 2))
            continue
        out.append([name, _cell(row.get("samples_per_s")), _cell(row.get("tokens_per_s"), 0),
                    _cell(row.get("time_to_first_step_s"), 1), _cell(row.get("peak_gpu_mib")),
                    _cell(row.get("tau_humaneval")), _cell(row.get("tau_explain"))])
    return out


def _best(runs: dict, key: str, ours: bool) -> Optional[tuple[str, float]]:
    got = [(n, r[key]) for n, r in runs.items() if r.get("status") == "ok"
           and (r.get("trainer") == "ours") == ours and r.get(key) is not None]
    return max(got, key=lambda p: p[1]) if got else None


def goals(result: dict) -> list[str]:
    """One line per goal: the best of our runs against the best peer run that finished."""
    runs = result.get("runs", {})
    lines = []
    for key, what in (("samples_per_s", "samples/s"), ("tau_humaneval", "tau HumanEval"),
                      ("tau_explain", "tau explain")):
        ours, peer = _best(runs, key, ours=True), _best(runs, key, ours=False)
        if ours is None or peer is None:
            missing = "no run of ours" if ours is None else "no peer run"
            lines.append(f"{what}: not compared ({missing} finished)")
            continue
        if key == "samples_per_s":
            ratio = ours[1] / peer[1]
            verdict = "met" if ratio >= SPEED_GOAL else "not met"
            lines.append(f"{what}: {ours[0]} {ours[1]:.2f} vs {peer[0]} {peer[1]:.2f}, "
                         f"{ratio:.2f}x (goal {SPEED_GOAL:g}x: {verdict})")
        else:
            margin = ours[1] - peer[1]
            verdict = "met" if margin >= 0 else "not met"
            lines.append(f"{what}: {ours[0]} {ours[1]:.2f} vs {peer[0]} {peer[1]:.2f}, "
                         f"margin {margin:+.2f} (goal >= 0: {verdict})")
    return lines


def markdown(result: dict) -> str:
    head = [f"| {' | '.join(_COLUMNS)} |", "| --- |" + " ---: |" * (len(_COLUMNS) - 1)]
    body = [f"| {' | '.join(r)} |" for r in rows(result)]
    where = (f"{result.get('device_name', '?')}, {result.get('budget_min')} min of training "
             f"a run, scale {result.get('scale')}")
    return "\n".join([*head, *body, "", where, "", *(f"- {g}" for g in goals(result))]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers_steps.table",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("result", help="a peers.json")
    args = p.parse_args(argv)
    print(markdown(json.loads(Path(args.result).read_text())), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
