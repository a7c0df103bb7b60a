"""A real 8B job on one GPU, end to end, as a user runs it: start, checkpoints, evals, a
SIGKILLed drafter, recovery, export.

    python -m bench.e2e_8b --work /tmp/e2e --out docs/bench     # one H200, about 8 minutes
    python -m bench.e2e_8b --work /tmp/e2e --out /tmp/files --set train.checkpoint.read_ahead=false

It builds a random-weight target with Qwen3-8B's architecture (save_pretrained, loaded back by
the real code), writes ~800-token chats, then runs ``python -m pipeline.train --config-name
qwen3_8b cluster=one_gpu`` for ``--steps`` steps with a checkpoint and a tau evaluation every
``--every`` steps (the evaluation only where the GPU holds it beside the job: ``--eval``).
Once ``--kill-at`` steps are done it SIGKILLs the drafter's process (found by Ray's process
title, ``ray::DrafterWorker``). It writes ``<out>/h200_e2e_8b.json``:

* ``start_to_first_step_s``: from the launch of the CLI to the first logged step;
* ``checkpoint_stall_s``: the longest a save held the step loop (the driver's log), and
  ``checkpoint_step_excess_s``: how much longer the steps right after a save took than
  the median step (not counting those right after a restart);
* ``kill_to_training_s``: from the SIGKILL to the first step completed after the restart;
  ``killed_drafter_gone_s``: from the SIGKILL until the killed process had let go of its
  memory and GPU (what a new drafter on that GPU waits for at least);
  ``after_restart_step_times_s``: the first twenty steps' times after the restart, and
  ``after_restart_excess_s``: how much longer than the median step the second to twentieth
  took together (the first compiles; the writing rank pins its save buffers from the load on);
  ``restart_parts_s``: the restart's parts as its log line gives them (drafters killed and
  data re-planned, drafters built, process group and rings, checkpoint loaded);
  ``drafter_starts_s``: drafter rank 0's start-ups (the job's, then the restart's), each the
  seconds from being asked for to up and their parts (before its constructor: a Ray worker,
  the interpreter, the imports; then device ready, drafter built (the target's head read
  beside it), waited for the target head, optimizer and compile set up, rest);
  ``checkpoint_loads_s``: each load's parts on drafter rank 0 (read from the files, or
  waited for the read-ahead and copied from host memory, the default; ``--set
  train.checkpoint.read_ahead=false`` for the files);
* ``checkpoint_write_s``: the longest a checkpoint took to be written and verified beside
  training (the driver's log);
* ``start_to_first_step_warm_s``: the same launch again as a fresh job in a new run folder
  (``--relaunch-steps`` steps, no evaluation, one checkpoint at its end), once the first
  run has left its compiled graphs in the compile cache: what a user's second job on the
  machine waits;
* ``steady_samples_per_s``; ``e2e_efficiency``: median step time x steps / wall time;
* ``e2e_efficiency_after_start``: the same over the wall time after the first step;
* ``resumed_from_step``: the checkpoint the restart loaded (0: none, from the start);
* ``resumed_ok``: the restart loaded a checkpoint and every step trained twice (after the
  checkpoint, before the kill) has the same loss both times, within ``--loss-rtol``.

The kill waits until a checkpoint is durable (its "checkpoint ..." line is in the log): at 8B
a write takes ~40 s beside training, and on the H200 a kill 39 s after the save at step 100
found no checkpoint yet and the restart began again at step 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from bench.card import LARGE_CARD_GB, card_gb
from bench.run_log import jsonl_rows, last_line
from bench.scale.synthetic import build_target, write_chats


def _descendants(root: int) -> list[int]:
    """Every process under ``root``, read from /proc (parent pid is field 4 of stat)."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        kids = [pid for pid, ppid in parent.items() if ppid in frontier]
        found += kids
        frontier = kids
    return found


def _drafter_pid(root: int) -> int | None:
    """The drafter actor's process among ``root``'s descendants (the CLI's own local Ray:
    another Ray on the machine, e.g. a test suite, has drafters of its own)."""
    for pid in _descendants(root):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"DrafterWorker" in title:
            return pid
    return None


def _rows(metrics: Path) -> list[dict]:
    return jsonl_rows(metrics)  # polled while the run appends to it


def _command(args, target: Path, data: Path, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "pipeline.train", "--config-name", "qwen3_8b",
            "cluster=one_gpu", "logger=none", f"target.path={target}",
            f"data.train_path={data}", f"data.heldout_path={data}",
            f"data.max_length={args.max_length}", f"data.micro_batch_size={args.micro_batch}",
            f"drafter.num_anchors={args.anchors}", "train.plan.epochs=1",
            f"train.plan.max_steps={args.steps}", f"train.checkpoint.every={args.every}",
            "train.checkpoint.resume=null", "train.checkpoint.keep_last=2",
            f"train.eval.every={args.every if args.eval == 'on' else -1}",
            f"train.eval.prompts={args.eval_prompts}",
            "train.eval.max_new_tokens=64", "train.log_every=10", f"train.out_dir={run_dir}",
            *args.set]


def _run_and_kill(cmd: list[str], log_path: Path, metrics: Path, kill_at: int,
                  deadline_s: float, wait_checkpoint: bool) -> dict:
    """Run the CLI; SIGKILL the drafter once ``kill_at`` steps are logged; stop the whole job
    at ``deadline_s`` (the figures then cover what it did by then)."""
    t_launch = time.time()
    killed_at, gone_s = None, None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
        while proc.poll() is None:
            time.sleep(0.5)
            if time.time() - t_launch > deadline_s:
                print(f"[e2e] deadline of {deadline_s:.0f}s reached: stopping the job", flush=True)
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                break
            if killed_at is None and _due(metrics, log_path, kill_at, wait_checkpoint):
                pid = _drafter_pid(proc.pid)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed_at = time.time()
                    print(f"[e2e] SIGKILL drafter pid {pid} after step {kill_at}", flush=True)
                    gone_s = gone_after(pid)
    return {"launch": t_launch, "exit": time.time(), "killed_at": killed_at,
            "gone_s": gone_s,
            "returncode": proc.returncode}


def gone_after(pid: int, limit_s: float = 60.0) -> Optional[float]:
    """Seconds until a killed process has let go of its memory and devices (gone, or a zombie:
    the kernel frees those before the exit status waits for its parent), None past
    ``limit_s``. Until then the GPU and its Ray resources are not free for a new drafter."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return time.perf_counter() - t0
        if state in ("Z", "X"):
            return time.perf_counter() - t0
        time.sleep(0.01)
    return None


def _due(metrics: Path, log_path: Path, kill_at: int, wait_checkpoint: bool) -> bool:
    """Whether to kill now: ``kill_at`` steps logged and, if asked, a checkpoint durable."""
    if not any(r.get("step", 0) >= kill_at and "train/loss" in r for r in _rows(metrics)):
        return False
    return not wait_checkpoint or _CHECKPOINT.search(log_path.read_text()) is not None


_CHECKPOINT = re.compile(r"checkpoint \S*checkpoints/step_0*(\d+) \(held")
_WRITTEN = re.compile(r"written and verified in ([0-9.]+)s")
_RESUMED = re.compile(r"resuming from step (\d+)")
_RESTART_PARTS = re.compile(r"actor set restarted [0-9.]+s after the loss \((.*)\)")


_DRAFTER_UP = re.compile(r"drafter rank 0 up ([0-9.]+)s after it was asked for \((.*)\)")
_LOADED = re.compile(r"resumed from \S+ at step \d+ \(drafter rank 0: (.*)\)")


def _parts(listed: str) -> dict[str, float]:
    """``"a 1.0s, b c 2.5s"`` -> {"a": 1.0, "b c": 2.5}."""
    return {name: float(value) for name, value in re.findall(r"(.+?) ([0-9.]+)s(?:, |$)", listed)}


def _restart_parts(log_text: str) -> Optional[dict[str, float]]:
    """The first restart's parts from its log line: {"checkpoint loaded": 16.5, ...}."""
    found = _RESTART_PARTS.search(log_text)
    return None if found is None else _parts(found.group(1))


def _drafter_starts(log_text: str) -> list[dict[str, float]]:
    """Each start of drafter 0 (the job's, then each restart's), from its log line: the
    seconds since it was asked for (``up``) and their parts."""
    return [{"up": float(up), **_parts(listed)} for up, listed in _DRAFTER_UP.findall(log_text)]


AFTER = 20  # steps after a restart whose times the summary lists


def _summarise(times: dict, rows: list[dict], log_text: str, samples_per_step: int,
               loss_rtol: float) -> dict:
    train = [r for r in rows if "train/loss" in r]
    steps = max(r["step"] for r in train)
    times["exit"] = max(times["exit"], train[-1]["time"]) if times["returncode"] == 0 else \
        train[-1]["time"]  # a job stopped at the deadline: wall time up to its last step
    step_times = [r["perf/step_time_s"] for r in train if r["step"] > 10]
    median_step = statistics.median(step_times)
    killed = times["killed_at"]
    after_kill = [r for r in train if killed is not None and r["time"] > killed]
    first_pass: dict[int, float] = {}
    repeated: dict[int, tuple[float, float]] = {}
    for r in train:
        if r["step"] in first_pass:
            repeated[r["step"]] = (first_pass[r["step"]], r["train/loss"])
        else:
            first_pass[r["step"]] = r["train/loss"]
    rel = [abs(a - b) / max(abs(a), 1e-12) for a, b in repeated.values()]
    held = [float(x) for x in re.findall(r"held training ([0-9.]+)s", log_text)]
    saves = sorted({int(s) for s in _CHECKPOINT.findall(log_text)})
    # The steps right after a restart (the first compiles) are not a save's: they have
    # figures of their own below.
    restart_window = {id(r) for r in after_kill[:AFTER]}
    excess = [r["perf/step_time_s"] - median_step for r in train
              if any(r["step"] in (s + 1, s + 2) for s in saves) and id(r) not in restart_window]
    wall = times["exit"] - times["launch"]
    first_step_s = train[0]["time"] - times["launch"]
    resumed = _RESUMED.search(log_text)
    resumed_from = int(resumed.group(1)) if resumed else None
    return {
        "steps": steps,
        "wall_s": wall,
        "start_to_first_step_s": first_step_s,
        "checkpoint_stall_s": max(held) if held else None,
        "checkpoint_held_s": held,
        "checkpoint_write_s": max((float(x) for x in _WRITTEN.findall(log_text)), default=None),
        "checkpoint_step_excess_s": max(excess) if excess else None,
        "kill_to_training_s": after_kill[0]["time"] - killed if after_kill else None,
        "after_restart_step_times_s": [r["perf/step_time_s"] for r in after_kill[:AFTER]],
        "after_restart_excess_s": sum(max(0.0, r["perf/step_time_s"] - median_step)
                                      for r in after_kill[1:AFTER]) if after_kill else None,
        "killed_drafter_gone_s": times.get("gone_s"),
        "restart_parts_s": _restart_parts(log_text),
        "drafter_starts_s": _drafter_starts(log_text),
        "checkpoint_loads_s": [_parts(m) for m in _LOADED.findall(log_text)],
        "steady_step_time_s": median_step,
        "steady_samples_per_s": samples_per_step / median_step,
        "e2e_efficiency": median_step * steps / wall,
        "e2e_efficiency_after_start": median_step * steps / (wall - first_step_s),
        "resumed_from_step": resumed_from,
        "resumed_ok": bool(repeated) and max(rel) <= loss_rtol and bool(resumed_from),
        "repeated_steps": sorted(repeated),
        "repeated_loss_max_rel_diff": max(rel) if rel else None,
        "evals": sorted(r["step"] for r in rows if "eval/tau" in r),
        "restarts": log_text.count("restart 1 of"),
        "exported": "export" in log_text or None,
    }


def eval_on(choice: str, gpu_gb: Optional[float] = None) -> bool:
    """``--eval``: on, off, or auto: on where the GPU (``gpu_gb``, else read) is a large card.
    Below it the tau evaluator does not fit beside target and drafter at this recipe: on an
    80 GB H100 (2026-12-05) the target held 15.3 GiB, the drafter 36.0 and the evaluator 26.3
    after its first evaluation, and the drafter's first step ran out."""
    if choice != "auto":
        return choice == "on"
    if gpu_gb is None:
        gpu_gb = card_gb()
    return gpu_gb is None or gpu_gb >= LARGE_CARD_GB


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default="/tmp/e2e_8b", help="target, data and the run (large)")
    p.add_argument("--out", default="docs/bench")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=100, help="checkpoint and eval interval")
    p.add_argument("--kill-at", type=int, default=130)
    p.add_argument("--max-length", type=int, default=800)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--anchors", type=int, default=256)
    p.add_argument("--eval-prompts", type=int, default=8)
    p.add_argument("--eval", choices=("auto", "on", "off"), default="auto",
                   help=f"tau evaluations every --every steps; auto: on where the GPU has at "
                        f"least {LARGE_CARD_GB:.0f} GB (not beside an 80 GB card's job)")
    p.add_argument("--loss-rtol", type=float, default=1e-3)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override added to both jobs' commands (repeatable), e.g. "
                        "train.checkpoint.read_ahead=false")
    p.add_argument("--deadline-s", type=float, default=540.0,
                   help="stop the job after this long and report what it did")
    p.add_argument("--relaunch-steps", type=int, default=3,
                   help="then launch a fresh job of this many steps on the warm compile "
                        "cache (0: not)")
    args = p.parse_args(argv)
    args.eval = "on" if eval_on(args.eval) else "off"  # decided once, for both jobs
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    target = build_target(work / "qwen3-8b-random")
    samples = 4 * args.steps * 2 + 64
    data = write_chats(work / "chats.jsonl", count=samples, prompt_words=190,
                       answer_words=590)
    print(f"[e2e] target and data ready in {time.time() - t0:.0f}s", flush=True)
    run_dir = work / "run"
    # A fresh run (train.checkpoint.resume=null refuses a folder holding an earlier run's
    # checkpoints, and an earlier run's metrics must not count).
    shutil.rmtree(run_dir, ignore_errors=True)
    log_path = out / "e2e_8b_train.log"
    times = _run_and_kill(_command(args, target, data, run_dir), log_path,
                          run_dir / "metrics.jsonl", args.kill_at, args.deadline_s,
                          wait_checkpoint=args.every <= args.kill_at)
    log_text = log_path.read_text()
    result = {"machine": _gpu_name(), "date": time.strftime("%Y-%m-%d"),
              "command": "python -m bench.e2e_8b " + " ".join(argv or sys.argv[1:]),
              "returncode": times["returncode"], "eval": args.eval}
    rows = _rows(run_dir / "metrics.jsonl")
    result["completed"] = times["returncode"] == 0
    if not result["completed"]:
        result["error"] = last_line(log_path)  # the log may not outlive the machine
    if any("train/loss" in r for r in rows):
        result.update(_summarise(times, rows, log_text,
                                 samples_per_step=2 * args.micro_batch, loss_rtol=args.loss_rtol))
        result["exported"] = (run_dir / "export" / "model.safetensors").exists()
    # Written before the relaunch too: a device call cut during it keeps the job's figures.
    (out / "h200_e2e_8b.json").write_text(json.dumps(result, indent=2))
    if args.relaunch_steps:
        result["start_to_first_step_warm_s"] = _relaunch(args, target, data, work, out)
        (out / "h200_e2e_8b.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2), flush=True)
    return result


def relaunch_args(args) -> argparse.Namespace:
    """The relaunch's arguments: ``--relaunch-steps`` steps, no evaluation. It measures the
    start; on 2026-12-05 its step-0 and final tau (40 s each at 8B) carried the bench past a
    600 s device call, and this figure was lost."""
    return argparse.Namespace(**{**vars(args), "steps": args.relaunch_steps, "every": 0,
                                 "eval": "off"})


def _relaunch(args, target: Path, data: Path, work: Path, out: Path) -> float | None:
    """A fresh job of ``--relaunch-steps`` steps in a new run folder: seconds from its launch
    to its first step (None when it logged none)."""
    run_dir = work / "run_warm"
    shutil.rmtree(run_dir, ignore_errors=True)
    times = _run_and_kill(_command(relaunch_args(args), target, data, run_dir),
                          out / "e2e_8b_warm.log",
                          run_dir / "metrics.jsonl", kill_at=10**9,
                          deadline_s=args.deadline_s, wait_checkpoint=False)
    train = [r for r in _rows(run_dir / "metrics.jsonl") if "train/loss" in r]
    return train[0]["time"] - times["launch"] if train else None


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    main()
