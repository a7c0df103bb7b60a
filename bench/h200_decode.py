"""Decoding at engine speed on one GPU: regeneration and tau evaluation, each beside today's path.

    python -m bench.h200_decode --gguf /path/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --humaneval /path/HumanEval.jsonl.gz --out docs/bench/h200_decode.json --logs DIR
    python -m bench.h200_decode --scale tiny --out /tmp/decode.json --logs /tmp/decode_logs  # CPU

On a device whose calls end at 600 s, the same runs in two calls adding to one JSON
(``--part``, in either order; a new ``--out`` path for a new measurement):

    python -m bench.h200_decode --part 2 --out D.json --logs DIR     # no GGUF needed
    python -m bench.h200_decode --part 1 --gguf ... --humaneval ... --out D.json --logs DIR

Runs, each in its own process (so one's memory and compiled graphs do not touch the next), in
this order: regeneration by the static-cache engine against plain ``generate`` on the same
prompts, then sustained (many more prompts than rows, on one kept engine, setup timed apart),
then one decode step alone beside its datasheet ceiling, with a kernel profile
(``bench.decode_static``), for SmolLM2-135M-Instruct (real weights, from its GGUF file through
the pipeline's own conversion) and for the Qwen3-8B shape (random weights); tau evaluation of
64 prompts x 256 new tokens by the batched evaluator and by the per-prompt one on 2 prompts
(``bench.decode_eval``); the 8B training step alone and beside a running evaluation
(``bench.eval_beside_training``); and the CPU fp32 check that the two evaluators give the
same tau and outputs. The sustained runs on the ``triton`` step, regeneration's default on
CUDA, run by default, and at the 8B shape also with the step and the prefills compiled
(``q8b_compile_prefill``, what the README gives a long regeneration); transformers'
continuous batching (``bench.decode_regen``), the other compiled runs (``smol_compile``,
``q8b_compile``, ``q8b_triton_compile``) and those on the ``varlen`` step (``smol_varlen``,
``q8b_varlen``) run only when named in ``--only``.
The sustained runs' rows follow the card (``ROWS``: fewer on an 80 GB card, where the H200's
rows leave prompts outside the kept cache); the JSON says which (``sustained_rows``).
The runs share ``--budget-s``: each gets what is left (at most its own cap), and one that
would start with too little is skipped and said so. The result file,
written after every run, gathers the figures under the keys of issue 32 and keeps every
sub-result (partial ones of a run cut short included) under ``runs``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.card import LARGE_CARD_GB, card_gb
from bench.run_log import last_line

log = logging.getLogger(__name__)

# name -> (module, arguments, seconds it may take at most). {folder}, {humaneval} (the converted
# GGUF: runs that name them wait for the conversion, which starts at once in a thread), {logs}
# and {timeout} are filled in per run. In order of what the figures are worth: a call cut
# short loses the tail, and every run's JSON is gathered as it ends. The real model comes
# first: on 2026-12-03 the 8B runs, then first, took a 420 s budget whole and SmolLM2's never
# started (its conversion costs a minute of CPU, nothing when $DFLASH_GGUF_CACHE holds it).
# BACKGROUND runs (CPU only) start at once beside the others and are gathered at the end.
H200 = {
    "smol_static": ("bench.decode_static", "--model {folder} --prompts 512 --max-new-tokens 256 "
                    "--batch 512 --runs static,hf --humaneval {humaneval} "
                    "--sustained-prompts 4096 --sustained-batch 2048 --step-rows 2048 "
                    "--profile {logs}/smol_step_profile.txt", 150),
    "smol_eval": ("bench.decode_eval", "--target {folder} --prompts 64 --max-new-tokens 256 "
                  "--baseline-prompts 2 --batch-size 64 --humaneval {humaneval}", 90),
    # Sustained decoding with the varlen step (each row's cache read to its own length) at the
    # rows where it was fastest on 2026-12-04: on request since triton became the default.
    "smol_varlen": ("bench.decode_static", "--model {folder} --runs= --max-new-tokens 256 "
                    "--humaneval {humaneval} --sustained-prompts 8192 "
                    "--sustained-batch {smol_rows} --attention varlen", 90),
    # The 8B sustained figure comes from q8b_triton; the step timed with the two attentions
    # that read each row to its own length (sdpa, matmul and flex were measured slower on
    # 2026-12-04, and flex's compile at this shape alone outlasts the run's share of a call:
    # on 2026-12-05 the run was cut at 200 s in its step timings).
    "q8b_static": ("bench.decode_static", "--model qwen3_8b_random --prompts 256 "
                   "--max-new-tokens 256 --batch 256 --runs static,hf --step-rows {q8b_rows} "
                   "--step-attention varlen,triton --profile {logs}/q8b_step_profile.txt", 170),
    "q8b_eval": ("bench.decode_eval", "--target qwen3_8b_random --prompts 64 "
                 "--max-new-tokens 256 --baseline-prompts 2 --batch-size 64", 180),
    "q8b_varlen": ("bench.decode_static", "--model qwen3_8b_random --runs= --max-new-tokens 256 "
                   "--sustained-prompts 1024 --sustained-batch {q8b_rows} --attention varlen", 150),
    # The same sustained runs with the decode step compiled (--static-compile; the compile is
    # in the setup): on request until they choose the option's default.
    "smol_compile": ("bench.decode_static", "--model {folder} --runs= --max-new-tokens 256 "
                     "--humaneval {humaneval} --sustained-prompts 8192 "
                     "--sustained-batch {smol_rows} --attention varlen --compile-step", 150),
    "q8b_compile": ("bench.decode_static", "--model qwen3_8b_random --runs= --max-new-tokens 256 "
                    "--sustained-prompts 1024 --sustained-batch {q8b_rows} --attention varlen "
                    "--compile-step", 220),
    # The same sustained runs on the triton step (pipeline/regen/row_kernel.py), plain (by
    # default: regeneration's auto on CUDA) and compiled (on request).
    "smol_triton": ("bench.decode_static", "--model {folder} --runs= --max-new-tokens 256 "
                    "--humaneval {humaneval} --sustained-prompts 8192 "
                    "--sustained-batch {smol_rows} --attention triton", 90),
    # The same with prefill calls 4x larger: fewer calls, where they are bound by the host.
    "smol_triton_prefill64k": ("bench.decode_static", "--model {folder} --runs= "
                               "--max-new-tokens 256 --humaneval {humaneval} "
                               "--sustained-prompts 8192 --sustained-batch {smol_rows} "
                               "--attention triton --prefill-tokens 65536", 90),
    "q8b_triton": ("bench.decode_static", "--model qwen3_8b_random --runs= --max-new-tokens 256 "
                   "--sustained-prompts 1024 --sustained-batch {q8b_rows} --attention triton", 150),
    "q8b_triton_compile": ("bench.decode_static", "--model qwen3_8b_random --runs= "
                           "--max-new-tokens 256 --sustained-prompts 1024 "
                           "--sustained-batch {q8b_rows} --attention triton --compile-step", 220),
    # The compiled triton step with the prefills compiled too (--compile-prefill): on request.
    "q8b_compile_prefill": ("bench.decode_static", "--model qwen3_8b_random --runs= "
                            "--max-new-tokens 256 --sustained-prompts 1024 "
                            "--sustained-batch {q8b_rows} --attention triton --compile-step "
                            "--compile-prefill", 300),
    "q8b_beside": ("bench.eval_beside_training", "--shape qwen3_8b --steps 10 --warmup 3 "
                   "--duties 0.15,0.2,1.0 --work {logs}/beside --timeout {timeout}", 170),
    "cpu_eval_equal": ("bench.decode_eval", "--target builtin:tiny-qwen3 --prompts 6 "
                       "--max-new-tokens 24 --device cpu --dtype float32 --graphs off "
                       "--batch-size 3", 120),
    "smol_cb": ("bench.decode_regen", "--model {folder} --prompts 512 --max-new-tokens 256 "
                "--batch 512 --humaneval {humaneval}", 150),
}
# On a shared CPU a tiny run can take minutes: its cap only stops a hung run.
TINY_CAP_S = 1200
TINY = {
    "q8b_static": ("bench.decode_static", "--model {folder} --prompts 4 --max-new-tokens 4 "
                   "--batch 4 --runs static,hf --device cpu --dtype fp32 --random-prompts 3:9 "
                   "--sustained-prompts 9 --sustained-batch 3 --step-rows 3", TINY_CAP_S),
    "q8b_beside": ("bench.eval_beside_training", "--shape tiny --device cpu --steps 2 "
                   "--warmup 1 --duties 0.5 --eval-prompts 2 --eval-batch 2 "
                   "--eval-new-tokens 4 --work {logs}/beside --timeout {timeout}", TINY_CAP_S),
    "smol_static": ("bench.decode_static", "--model {folder} --prompts 6 --max-new-tokens 6 "
                    "--batch 4 --runs static,hf --device cpu --dtype fp32 "
                    "--humaneval {humaneval} --sustained-prompts 10 --sustained-batch 4 "
                    "--step-rows 4 --profile {logs}/smol_step_profile.txt", TINY_CAP_S),
    "smol_eval": ("bench.decode_eval", "--target {folder} --prompts 4 --max-new-tokens 8 "
                  "--baseline-prompts 2 --batch-size 4 --device cpu --dtype float32 "
                  "--graphs off --block-size 4 --humaneval {humaneval}", TINY_CAP_S),
    "cpu_eval_equal": H200["cpu_eval_equal"][:2] + (TINY_CAP_S,),
    "smol_varlen": ("bench.decode_static", "--model {folder} --runs= --max-new-tokens 6 "
                    "--device cpu --dtype fp32 --humaneval {humaneval} --sustained-prompts 10 "
                    "--sustained-batch 4 --attention varlen", TINY_CAP_S),
    "smol_cb": ("bench.decode_regen", "--model {folder} --prompts 4 --max-new-tokens 6 "
                "--batch 4 --device cpu --dtype float32 --humaneval {humaneval}", TINY_CAP_S),
    "smol_triton": ("bench.decode_static", "--model {folder} --runs= --max-new-tokens 6 "
                    "--device cpu --dtype fp32 --humaneval {humaneval} --sustained-prompts 10 "
                    "--sustained-batch 4 --attention triton", TINY_CAP_S),
}
BACKGROUND = ("cpu_eval_equal",)
MIN_START_S = 20  # a run is not started with less of the budget left than this
# The default runs in two device calls of at most 600 s each (``--part``): the whole set takes
# some 900 s on an H200 (2026-12-05: with a 500 s budget the 8B runs and the triton runs were
# cut or skipped). Each part adds its runs to --out: one JSON, the parts in either order
# (part 2 needs no GGUF, so it can run while the file is still being carried over).
# Part 1 took 275 s on the H200 on 2026-12-06; the 8B run with both compiles (some 150 s of
# set-up on an empty compile cache, the configuration the README gives a long regeneration)
# fits beside it in one call.
PARTS = {"1": ("smol_triton", "smol_static", "smol_eval", "q8b_triton", "q8b_compile_prefill",
               "smol_triton_prefill64k", "cpu_eval_equal"),
         "2": ("q8b_static", "q8b_eval", "q8b_beside")}
# Run only when named in --only: continuous batching (measured on 2026-12-03, docs/BENCHMARKS.md,
# and slow: 90 s), the other compiled runs (a compile of up to a minute each), and the
# varlen step (auto's pick until the triton step measured faster on an H100, 2026-12-05), and
# the prefill calls 4x larger (until the prefill's figures say whether the host bounds them;
# on the H200 on 2026-12-05 they did, so ``--part 1`` runs it, last).
ON_REQUEST = ("smol_cb", "smol_triton_prefill64k", "smol_compile", "q8b_compile", "smol_varlen",
              "q8b_varlen", "q8b_triton_compile")


class Run:
    """One sub-bench in its own process, writing its JSON to ``logs/<name>.json``."""

    def __init__(self, name: str, module: str, args: str, logs: Path, env=None) -> None:
        self.name, self.out = name, logs / f"{name}.json"
        self.out.unlink(missing_ok=True)
        self.cmd = [sys.executable, "-m", module, *args.split(), "--out", str(self.out)]
        self.log = open(logs / f"{name}.log", "w")
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def finish(self, timeout: float) -> dict:
        """Its JSON (what it wrote, even when cut short at ``timeout`` s), or why none."""
        try:
            rc = self.proc.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = f"timeout after {time.perf_counter() - self.t0:.0f} s"
        self.log.close()
        wall = round(time.perf_counter() - self.t0, 1)
        found = json.loads(self.out.read_text()) if self.out.exists() else {}
        if rc == 0:
            log.info("%s: rc 0 in %.1f s", self.name, wall)
            return {**found, "wall_s": wall}
        # The cause in the summary itself: a run's log may not survive the machine it ran on.
        last = last_line(Path(self.log.name))
        log.info("%s: rc %s in %.1f s: %s", self.name, rc, wall, last)
        return {**found, "error": f"{' '.join(self.cmd[1:])} ended rc {rc} after {wall} s "
                                  f"({last}); see {self.name}.log"
                                  + ("; partial figures kept" if found else ""),
                "wall_s": wall}


def gather(runs: dict) -> dict:
    """The headline figures of issue 32 from the sub-results (None where a run failed)."""
    def pick(name, *path):
        node = runs.get(name, {})
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node

    def sustained(label, name):
        return {f"regen_sustained_{label}_tokens_per_s": pick(name, "sustained", "tokens_per_s"),
                f"regen_sustained_{label}_decode_tokens_per_s": pick(name, "sustained", "timed",
                                                                     "decode_tokens_per_s")}

    def model(prefix, cb, evaluation):
        static = f"{prefix}_static"
        step = pick(static, "step") or {}
        compiled = f"{prefix}_compile"
        return {
            "regen_tokens_per_s": pick(static, "runs", "static", "tokens_per_s"),
            "regen_sustained_tokens_per_s": pick(static, "sustained", "tokens_per_s"),
            "regen_sustained_decode_tokens_per_s": pick(static, "sustained", "timed",
                                                        "decode_tokens_per_s"),
            "regen_sustained": {k: pick(static, "sustained", *k.split(".")) for k in
                                ("prompts", "batch", "wall_s", "setup.wall_s",
                                 "timed.prefill_s", "timed.capture_s", "timed.decode_s",
                                 "timed.ms_per_step")},
            **sustained("varlen", f"{prefix}_varlen"),
            **sustained("compiled", compiled),
            "regen_sustained_compiled_setup_s": pick(compiled, "sustained", "setup", "wall_s"),
            **sustained("triton", f"{prefix}_triton"),
            **sustained("triton_prefill64k", f"{prefix}_triton_prefill64k"),
            **sustained("triton_compiled", f"{prefix}_triton_compile"),
            "regen_sustained_triton_compiled_setup_s": pick(f"{prefix}_triton_compile",
                                                            "sustained", "setup", "wall_s"),
            **sustained("compiled_prefill", f"{prefix}_compile_prefill"),
            "regen_sustained_compiled_prefill_prefill_s": pick(
                f"{prefix}_compile_prefill", "sustained", "timed", "prefill_s"),
            "regen_sustained_compiled_prefill_setup_s": pick(
                f"{prefix}_compile_prefill", "sustained", "setup", "wall_s"),
            "decode_step_ms": {f"{rows} rows, {name}": {
                k: v.get(k) for k in ("span", "captured_ms", "uncaptured_ms", "ceiling_ms",
                                      "ceiling_share", "error") if k != "error" or k in v}
                for rows, timing in step.items() for name, v in timing["variants"].items()},
            "prefill_call_ms": {f"{rows} rows, {layout}": v
                                for rows, timing in step.items()
                                for layout, v in (timing.get("prefill") or {}).items()},
            "cb_tokens_per_s": pick(cb, "regen_tokens_per_s"),
            "hf_generate_tokens_per_s": pick(static, "runs", "hf", "tokens_per_s"),
            "regen_identical_to_hf_share": pick(static, "runs", "static", "identical_share"),
            "cb_identical_to_hf_share": pick(cb, "identical_share"),
            "eval_seconds": {"batched": pick(evaluation, "batched", "eval_seconds"),
                             "per_prompt": pick(evaluation, "baseline", "eval_seconds")},
            "eval_prompts": {"batched": pick(evaluation, "batched", "prompts"),
                             "per_prompt": pick(evaluation, "baseline", "prompts")},
            "eval_speedup_per_prompt": pick(evaluation, "speedup_per_prompt"),
            "eval_outputs_agree_share": pick(evaluation, "outputs_agree_share"),
            "eval_tau_difference": pick(evaluation, "tau_difference"),
        }

    equal = runs.get("cpu_eval_equal", {})
    return {
        "smollm2_135m": model("smol", "smol_cb", "smol_eval"),
        "qwen3_8b_random": model("q8b", None, "q8b_eval"),
        "training_step_ms_8b": {name: pick("q8b_beside", "phases", name, "median_ms")
                                for name in (runs.get("q8b_beside", {}).get("phases") or {})},
        "training_slowdown_beside_eval_8b": pick("q8b_beside", "slowdown_vs_alone"),
        "training_slowdown_mean_beside_eval_8b": pick("q8b_beside", "slowdown_mean_vs_alone"),
        "eval_tau_equal": (None if "error" in equal or not equal else
                           equal.get("outputs_agree_share") == 1.0
                           and equal.get("tau_difference") == 0.0),
    }


def prepare_target(args, logs: Path) -> tuple[str, str]:
    """(HF folder, HumanEval file): the GGUF converted by the pipeline's own conversion, or
    at the tiny scale a tiny Llama GGUF and a two-prompt HumanEval-shaped file."""
    from pipeline.assets.gguf import gguf_folder

    gguf, humaneval = args.gguf, args.humaneval
    if args.scale == "tiny":
        from pipeline.assets.tiny_gguf import write_tiny_gguf

        gguf = str(logs / "tiny-llama.gguf")
        write_tiny_gguf(gguf)
        humaneval = str(logs / "humaneval_tiny.jsonl")
        Path(humaneval).write_text("".join(
            json.dumps({"task_id": f"t/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Add {i}.\"\"\"\n"})
            + "\n" for i in range(2)))
    return gguf_folder(gguf), humaneval


# The sustained runs' rows by the card's memory: the H200's 141 GB holds SmolLM2's cache at
# 4,096 rows and the 8B shape's at 512 for these prompts; an 80 GB H100 does not (2026-12-05:
# at 4,096 rows 340 of SmolLM2's 8,192 prompts went apart and took half the wall time; at 512
# rows every 8B prompt did), and runs at 2,048 and 256.
ROWS = {"large": {"smol_rows": 4096, "q8b_rows": 512},
        "80 GB": {"smol_rows": 2048, "q8b_rows": 256}}


def rows_for(gb: float | None) -> dict:
    """The sustained runs' rows on a card of ``gb`` GB (unknown: the large card's)."""
    return dict(ROWS["80 GB" if gb is not None and gb < LARGE_CARD_GB else "large"])


def earlier_runs(out: str, scale: str) -> dict:
    """The runs another part wrote to ``out`` (none where it does not exist yet), said in one
    line: parts run in either order, each in its own device call, and add to one file."""
    path = Path(out)
    if not path.exists():
        log.info("%s does not exist yet: this part starts it", out)
        return {}
    found = json.loads(path.read_text())
    if found.get("scale") != scale:
        raise SystemExit(f"bench.h200_decode: --out {out} holds scale {found.get('scale')!r}, "
                         f"not {scale!r}")
    runs = dict(found.get("runs") or {})
    log.info("adding to %s, which holds the runs %s", out, ", ".join(runs) or "(none)")
    return runs


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", choices=("h200", "tiny"), default="h200")
    p.add_argument("--gguf", default=None, help="SmolLM2-135M-Instruct's GGUF file")
    p.add_argument("--humaneval", default=None, help="HumanEval.jsonl(.gz)")
    p.add_argument("--only", default=None, help="comma-separated subset of the runs (default: "
                   f"all but {', '.join(ON_REQUEST)})")
    p.add_argument("--part", choices=sorted(PARTS), default=None,
                   help="the default runs in two calls, in either order, each adding its runs "
                        "to --out (give a new path for a new measurement): "
                        + "; ".join(f"{k}: {', '.join(v)}" for k, v in PARTS.items()))
    p.add_argument("--out", required=True, help="the result JSON")
    p.add_argument("--logs", required=True, help="folder for each run's log and JSON")
    p.add_argument("--budget-s", type=float, default=450.0,
                   help="seconds for all runs together, the conversion included: each run "
                        "gets at most what is left, and none starts with under "
                        f"{MIN_START_S} s left")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    plan = TINY if args.scale == "tiny" else H200
    if args.part and args.only:
        raise SystemExit("bench.h200_decode: --part and --only: give one of them")
    if args.only:
        wanted = args.only.split(",")
    elif args.part:
        wanted = [n for n in PARTS[args.part] if n in plan]
    else:
        wanted = [n for n in plan if n not in ON_REQUEST]
    unknown = [name for name in wanted if name not in plan]
    if unknown:
        raise SystemExit(f"bench.h200_decode: --only {','.join(unknown)}: allowed {', '.join(plan)}")
    # A part adds its runs to those other parts left in --out (its own replace theirs).
    runs: dict = earlier_runs(args.out, args.scale) if args.part else {}
    # Only SmolLM2's runs read the GGUF and HumanEval; part 2 (the 8B shape, random weights)
    # runs without them, e.g. while the GGUF is still being carried over.
    needing = [n for n in wanted if "{folder}" in plan[n][1] or "{humaneval}" in plan[n][1]]
    if args.scale == "h200" and needing and (not args.gguf or not args.humaneval):
        raise SystemExit(f"bench.h200_decode: --gguf and --humaneval are needed at --scale h200 "
                         f"by {', '.join(needing)}")
    # The GGUF conversion (a minute of CPU) runs beside the runs that do not need it. It ends
    # before this function does, however it ends: transformers' loading patches process-wide
    # state (PreTrainedModel.tie_weights, torch's init functions) while it runs, and a
    # conversion left running beside the caller's own model loads (a test process's next
    # tests) left a tied head untied and on the meta device, and weights uninitialised.
    needs_gguf = bool(needing)
    with ThreadPoolExecutor(1) as pool:
        conversion = pool.submit(prepare_target if needs_gguf else lambda *_: None, args, logs)
        return _measure(args, plan, wanted, runs, conversion, logs, t0)


def _measure(args, plan: dict, wanted: list, runs: dict, conversion, logs: Path,
             t0: float) -> dict:
    """The runs of ``wanted``, each gathered into --out as it ends."""
    state = {"folder": None}
    gb = card_gb()
    rows = rows_for(gb)

    def write() -> dict:
        result = {"scale": args.scale, "target_folder": state["folder"],
                  "card_gb": gb, "sustained_rows": rows, **gather(runs),
                  "total_wall_s": round(time.perf_counter() - t0, 1), "runs": runs}
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        return result

    def fields(line: str, timeout: float) -> dict:
        values = {"logs": logs, "timeout": int(max(timeout - 10, 10)), **rows}
        if "{folder}" in line or "{humaneval}" in line:
            state["folder"], values["humaneval"] = conversion.result()
            values["folder"] = state["folder"]
        return values

    def left() -> float:
        return args.budget_s - (time.perf_counter() - t0)

    # CPU-only runs beside the rest, on few threads (the GPU runs' hosts need the cores).
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    background = {name: Run(name, plan[name][0], plan[name][1].format(
                      **fields(plan[name][1], plan[name][2])), logs, env)
                  for name in wanted if name in BACKGROUND}
    for name in wanted:  # in the order asked (parts and the default: by worth)
        module, line, cap = plan[name]
        if name in background:
            continue
        if left() < MIN_START_S:
            runs[name] = {"skipped": f"{left():.0f} s of the {args.budget_s:.0f} s budget left"}
            log.warning("%s: skipped, %.0f s of the budget left", name, left())
        else:
            try:
                argv_ = line.format(**fields(line, min(cap, left())))
            except Exception as e:  # the conversion failed: the runs that need it cannot run
                runs[name] = {"error": f"the GGUF conversion failed: {type(e).__name__}: {e}"}
                log.error("%s: %s", name, runs[name]["error"])
                write()
                continue
            # Its budget counts from its start: a wait for the conversion is not its time.
            timeout = min(cap, left())
            runs[name] = Run(name, module, argv_, logs).finish(timeout)
        # Written after every run: a call cut short still leaves the figures it made.
        write()
    for name, run in background.items():
        runs[name] = run.finish(min(plan[name][2], left()))
    if state["folder"] is None and conversion.done() and conversion.exception() is None \
            and conversion.result() is not None:
        state["folder"] = conversion.result()[0]
    result = write()
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    failed = [name for name, r in runs.items() if "error" in r or "skipped" in r]
    if failed:
        log.error("bench.h200_decode: %d run(s) failed, were cut or skipped: %s (see %s)", len(failed),
                  ", ".join(failed), logs)
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
