"""One run of the race: train (the trainer's module), make each mark's export a checked z-lab
folder, decode them apart, and the row the result file keeps."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

from bench.peers_steps import modelopt_run, ours, speculators_run, zlab
from bench.peers_steps.common import Ctx
from bench.peers_steps.runs import Run
from bench.quality import proc

log = logging.getLogger(__name__)
_TAIL = 30  # log lines kept in the result file for a run that failed


def race(run: Run, ctx: Ctx, mean_tokens: float) -> dict:
    row = {"trainer": run.trainer, "recipe": run.recipe, "overrides": list(run.overrides),
           "budget_min": ctx.scale.budget_min}
    if run.trainer != "ours" and ctx.peers_missing:
        log.warning("%s skipped: %s", run.name, ctx.peers_missing)
        return {**row, "status": "skipped", "reason": ctx.peers_missing}
    try:
        if run.trainer == "ours":
            got, rates = ours.train(run, ctx), ours.rates
        elif run.trainer == "modelopt":
            got, rates = modelopt_run.train(run, ctx), modelopt_run.rates
        else:
            got, rates = speculators_run.train(run, ctx, mean_tokens), speculators_run.rates
    except Exception as e:  # a peer that breaks on this machine: one line, the rest goes on
        log.exception("%s failed", run.name)
        return {**row, "status": "failed", "reason": f"{type(e).__name__}: {e}"[:400],
                "log_tail": proc.tail(ctx.work.log(run.name), _TAIL)}
    row["command"] = _shell(got["command"])
    if "skipped" in got:  # speculators on CPU: its dry-run checkpoint checks the plumbing
        print(f"{run.name}: skipped on {ctx.device}: {got['skipped']}", flush=True)
        draft = zlab.finish(Path(got["dry_run_dir"]))
        plumbing = _decode(ctx, run, {"dry_run": got["dry_run_dir"]}).get("dry_run")
        return {**row, "status": "skipped", "reason": got["skipped"], "draft": draft,
                "untrained_dry_run_decoded": plumbing}
    if got.get("resolved"):
        row["resolved_recipe"] = modelopt_run.recipe_summary(got["resolved"])
    w, pts = got["watched"], got["points"]
    first = pts[0].time if pts else None
    row.update({"returncode": w.returncode, "stopped_at_budget": w.stopped_at_budget,
                "time_to_first_step_s": None if first is None else round(first - w.launched, 1),
                "wall_s": round(w.ended - w.launched, 1), "steps": pts[-1].step if pts else 0,
                "peak_gpu_mib": w.peak_gpu_mib, **rates(got)})
    exports, by_step = {}, {}
    row["marks"] = []
    for k, (m, mark_s) in enumerate(zip(got["marks"], ctx.scale.mark_seconds)):
        if m is None:
            row["marks"].append({"mark_s": mark_s, "missing": "no checkpoint"})
            continue
        draft = zlab.finish(Path(m["dir"]))
        # a run that ended before its budget leaves one checkpoint for several marks
        label = by_step.setdefault(m["step"], f"mark{k}")
        exports[label] = m["dir"]
        row["draft"] = draft
        row["marks"].append({"mark_s": mark_s, "step": m["step"],
                             "train_min": round((m["time"] - first) / 60, 3) if first else None,
                             "gpu_min": round((m["time"] - w.launched) / 60, 3)})
    decoded = _decode(ctx, run, exports) if exports else {}
    for k, (m, mark) in enumerate(zip(got["marks"], row["marks"])):
        got_k = decoded.get(by_step[m["step"]]) if m else None
        if got_k:
            mark.update({"tau_humaneval": got_k["humaneval"]["tau"],
                         "tau_explain": got_k["explain"]["tau"],
                         "lossless": {s: got_k[s]["check"] for s in ("humaneval", "explain")},
                         "accepted_at_position": {s: got_k[s]["accepted_at_position"]
                                                  for s in ("humaneval", "explain")}})
    last = next((m for m in reversed(row["marks"]) if "tau_humaneval" in m), {})
    row.update({"tau_humaneval": last.get("tau_humaneval"),
                "tau_explain": last.get("tau_explain"),
                "status": "ok" if last else "failed"})
    if not last:
        row["reason"] = "no checkpoint was decoded"
        row["log_tail"] = proc.tail(ctx.work.log(run.name), _TAIL)
    return row


def _decode(ctx: Ctx, run: Run, exports: dict) -> dict:
    s = ctx.scale
    spec = {"target": ctx.target, "device": ctx.device, "prompts": s.decode_prompts,
            "max_new_tokens": s.decode_max_new_tokens,
            "sets": {"humaneval": str(ctx.work.data("humaneval")),
                     "explain": str(ctx.work.data("explain"))},
            "greedy_cache": str(ctx.work.path("greedy_cache.json")), "exports": exports}
    spec_path = ctx.work.path("decode", f"{run.name}.json")
    out = spec_path.with_suffix(".result.json")
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps(spec, indent=2))
    log_path = ctx.work.log(f"decode_{run.name}")
    with open(log_path, "w") as sink:
        done = subprocess.run([sys.executable, "-m", "bench.peers_steps.decode", "--spec",
                               str(spec_path), "--out", str(out)], cwd=proc.REPO_ROOT,
                              stdout=sink, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        log.error("decoding %s failed (exit %s); see %s", run.name, done.returncode, log_path)
        return {}
    return json.loads(out.read_text())


def _shell(cmd: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(c) for c in cmd)
