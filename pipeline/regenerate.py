"""Rewrite a chat file's assistant turns with the target's own greedy (T=0) answers.

    python -m pipeline.regenerate --input chats.jsonl --output regen.jsonl --target builtin:tiny
    python -m pipeline.regenerate --input sharegpt.jsonl --output regen.jsonl \\
        --target /models/Qwen3-8B --num-workers 8 --device cuda --max-new-tokens 2048 \\
        --on-bad-line skip
    ray job submit --address http://HEAD:8265 --working-dir . \\
        --runtime-env launch/runtime_env.yaml -- python -m pipeline.regenerate ...

Every assistant turn is regenerated in order, each from the conversation so far (earlier
assistant turns already regenerated); system and user turns are kept. A conversation that ends
with a user turn (a prompts-only line, the usual input) gets the answer to it appended.
Decoding runs on our static-cache engine (``--engine static``, the default: a KV cache
allocated once, finished rows refilled with waiting prompts, the decode step a CUDA graph),
on transformers' continuous-batching engine (``--engine cb``), or on left-padded ``generate``
batches (``--engine generate``, the baseline); static and cb fall back to ``generate`` with
one log line where they cannot serve the model. A run that writes
nothing (every line bad, or none at all) says so and ends rc 1. The output has one
record per good input line, in input order: ``{"messages": [...], "source_line": <0-based
input line>, "regen": {"num_tokens": [...], "finished": [...], "round_trips": [...]},
"fingerprint": {...}}`` (what it was made from: its input line, target, chat template,
thinking and max new tokens; pipeline/regen/fingerprint.py).
An answer is stored as the exact text the target wrote, reasoning included, and each turn is
checked to re-render through the template as that text (``round_trips``). Rerunning with the same
arguments resumes: complete records are kept (a half-written last line is cut off) and the
rest is appended. An output of another input or other settings is refused in one line naming
the first input line or setting that differs; ``--restart`` starts it anew. Ctrl-C and SIGTERM
(``ray job stop``, a preemption) end a run with one line that says so (exit 130 and 143), the
generators killed and the output's records whole. Work is spread over ``--num-workers`` Ray
actors, one GPU each on cuda.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import Optional, Sequence

from pipeline.runtime import startup_gc

if __name__ == "__main__":  # before the imports below (torch, Triton): until main read the input
    startup_gc.defer_full_collections()

from pipeline.runtime import stop_signals  # noqa: E402
from pipeline.job.cli_help import REGENERATE_EXAMPLES, REGENERATE_MAIN, add_short_help  # noqa: E402
from pipeline.data.config import FORMATS, ON_BAD_LINE  # noqa: E402
from pipeline.job.gpu_oom import gpu_oom_line  # noqa: E402
from pipeline.regen.cb import COMPILE_LEVELS, ENGINES, SWITCHES  # noqa: E402
from pipeline.regen.config import AUTO_COMPILE_FLOP, DEVICES, DTYPES, RegenConfig  # noqa: E402
from pipeline.regen.static_attention import CHOICES as ATTENTIONS  # noqa: E402
from pipeline.regen.runner import TargetRemade, execute, prepare  # noqa: E402

# One source of defaults: the flags show RegenConfig's.
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RegenConfig)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipeline.regenerate",
                                description=__doc__.split("\n\n")[0], add_help=False,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--input", required=True, help="chat JSONL (messages or ShareGPT)")
    p.add_argument("--output", required=True, help="JSONL to write, or to resume")
    p.add_argument("--restart", action="store_true",
                   help="start --output anew, the earlier file kept as "
                        "<output>.before-restart (a resume refuses an output of another "
                        "input or settings)")
    p.add_argument("--target", default=_DEFAULTS["target"],
                   help="HF model folder, or builtin:tiny")
    p.add_argument("--num-workers", type=int, default=_DEFAULTS["num_workers"],
                   help="generator actors, one GPU each on cuda")
    p.add_argument("--device", choices=DEVICES, default=_DEFAULTS["device"],
                   help="auto: cuda when the Ray cluster has GPUs")
    p.add_argument("--dtype", choices=DTYPES, default=_DEFAULTS["dtype"],
                   help="auto: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--engine", choices=ENGINES, default=_DEFAULTS["engine"],
                   help="static: our static-cache engine, rows refilled, CUDA-graph steps; "
                        "cb: transformers' continuous batching; generate: padded batches")
    p.add_argument("--batch-size", type=int, default=_DEFAULTS["batch_size"],
                   help="conversations per worker call (generate: its padded batch); "
                        "default 1024 with static and cb, 16 with generate")
    p.add_argument("--static-rows", type=int, default=_DEFAULTS["static_rows"],
                   help="static: requests decoded at once (the KV cache's rows)")
    p.add_argument("--static-attention", choices=ATTENTIONS,
                   default=_DEFAULTS["static_attention"],
                   help="static: the decode step's attention (flex, varlen and triton read "
                        "each row's own prefix only; auto: triton on CUDA (Ampere+) in "
                        "bf16/fp16, varlen where Triton is missing, else sdpa)")
    p.add_argument("--static-compile", action=argparse.BooleanOptionalAction,
                   default=_DEFAULTS["static_compile"],
                   help="static: the decode step through torch.compile (varlen or triton "
                        "attention only, auto's pick on CUDA); default auto: on CUDA "
                        "when a generator's answers (lines x --max-new-tokens at most) are "
                        f"worth {AUTO_COMPILE_FLOP:.0e} FLOPs (2 x parameters x tokens; about "
                        "18M tokens at 8B), where the minutes of compiling pay off")
    p.add_argument("--static-compile-prefill", action=argparse.BooleanOptionalAction,
                   default=_DEFAULTS["static_compile_prefill"],
                   help="static: the prefills through torch.compile (symbolic shapes, any "
                        "attention); default auto, as --static-compile")
    p.add_argument("--max-new-tokens", type=int, default=_DEFAULTS["max_new_tokens"],
                   help="per assistant turn")
    p.add_argument("--enable-thinking", action=argparse.BooleanOptionalAction,
                   default=_DEFAULTS["enable_thinking"],
                   help="passed to the chat template; train with the same data.enable_thinking")
    p.add_argument("--on-bad-line", choices=ON_BAD_LINE, default=_DEFAULTS["on_bad_line"],
                   help="stop at a malformed line, or count and leave it out")
    p.add_argument("--format", choices=FORMATS, default=_DEFAULTS["format"],
                   help="input line format; auto decides per line")
    p.add_argument("--in-flight-per-worker", type=int,
                   default=_DEFAULTS["in_flight_per_worker"], help="batches queued per actor")
    p.add_argument("--cpus-per-worker", type=float, default=_DEFAULTS["cpus_per_worker"],
                   help="Ray CPUs per actor")
    p.add_argument("--cb-max-batch-tokens", type=int,
                   default=_DEFAULTS["cb_max_batch_tokens"],
                   help="cb: tokens per forward; default: the library's, from GPU memory")
    p.add_argument("--cb-num-blocks", type=int, default=_DEFAULTS["cb_num_blocks"],
                   help="cb: KV cache pages; default: from free GPU memory")
    p.add_argument("--cb-max-requests", type=int, default=_DEFAULTS["cb_max_requests"],
                   help="cb: requests per forward; default: the library's")
    p.add_argument("--cb-cuda-graphs", choices=SWITCHES, default=_DEFAULTS["cb_cuda_graphs"],
                   help="cb: CUDA graphs")
    p.add_argument("--cb-compile-level", type=int, choices=COMPILE_LEVELS,
                   default=_DEFAULTS["cb_compile_level"],
                   help="cb: torch.compile of the steps, 0 (off) to 3")
    p.add_argument("--ray-address", default=None, help="default: $RAY_ADDRESS, else local")
    add_short_help(p, REGENERATE_MAIN, REGENERATE_EXAMPLES)  # -h: a page; --help-all: all
    return p


def engine_knobs(cfg: RegenConfig) -> list[str]:
    """The settings that shrink a generator's GPU memory, with this run's values."""
    if cfg.engine == "static":
        return [f"--static-rows {cfg.static_rows}",
                f"--max-new-tokens {cfg.max_new_tokens} (the cache's columns)"]
    if cfg.engine == "cb":
        return [f"--cb-num-blocks {cfg.cb_num_blocks or 'auto'}",
                f"--cb-max-batch-tokens {cfg.cb_max_batch_tokens or 'auto'}"]
    return [f"--batch-size {cfg.conversations_per_call}"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        # User mistakes (flags, bad input lines, a foreign output file) surface here, before
        # any actor starts, and are reported without a traceback.
        plan = prepare(RegenConfig(**args))
    except ValueError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    startup_gc.started()
    go_on = (f"the answers written so far stay in {plan.cfg.output}; the same command goes "
             f"on from them")
    try:
        summary = execute(plan)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM where the entry point installed it
        print(f"regenerate: {stop_signals.cause(stop)}; {go_on}", file=sys.stderr)
        return stop_signals.exit_code(stop)
    except TargetRemade as e:  # a damaged cached target, made again: the rerun loads it
        print(f"regenerate: {e}", file=sys.stderr)
        return 1
    except Exception as e:
        line = gpu_oom_line(e, lambda actor: engine_knobs(plan.cfg), go_on)
        if line is None:
            raise
        print(f"regenerate: {line}", file=sys.stderr)
        return 1
    if summary.regenerated + summary.resumed == 0:
        # Nothing was written, so no file is named; and a run whose every line was bad (or
        # whose input holds none) computed nothing: that is a failure, not rc 0.
        why = (f"all {summary.lines_read} line(s) of {plan.cfg.input} were bad"
               if summary.lines_read else f"{plan.cfg.input} holds no conversation")
        print(f"regenerate: {summary.line()}; nothing written: {why}", file=sys.stderr)
        return 1
    print(f"regenerate: {summary.line()} -> {plan.cfg.output}")
    return 0


if __name__ == "__main__":
    # SIGTERM (ray job stop, a preemption, kill) unwinds as Ctrl-C does: the generators are
    # killed, the output keeps its whole records, one line says how to go on, exit 143.
    stop_signals.install()
    try:
        sys.exit(main())
    except KeyboardInterrupt as stop:  # before any generation started (reading the input)
        print(f"regenerate: {stop_signals.cause(stop)}", file=sys.stderr)
        sys.exit(stop_signals.exit_code(stop))
