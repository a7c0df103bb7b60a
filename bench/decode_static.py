"""Greedy decoding throughput: the static-cache engine against HF ``generate``, same prompts.

    python -m bench.decode_static --model gguf:SmolLM2-135M-Instruct.Q4_1.gguf --humaneval HumanEval.jsonl.gz \
        --prompts 512 --max-new-tokens 256 --batch 512 --device cuda --out /tmp/decode_smol.json
    python -m bench.decode_static --model qwen3_8b_random --prompts 512 --max-new-tokens 256 \
        --batch 256 --device cuda --out /tmp/decode_8b.json

Runs (``--runs``, in order): ``static`` (pipeline.regen.static_engine with CUDA graphs), ``static_eager``
(the same, uncaptured), ``hf`` (``generate``, left-padded batches of ``--batch``) and
``hf_static`` (``generate`` with ``cache_implementation="static"``; off by default). Each
reports generated tokens (answers cut after their first stop token, stop included), wall
seconds and tokens/s after one untimed warm-up on a batch of 4-token answers; every run but
``hf`` also reports the share of answers identical to ``hf``'s and, for the first mismatches,
the first differing position (bf16 ties differ late; a wrong cache position differs early).
The static runs also split their wall time (``split``): prefill, graph captures, decode steps
(and ms a step). With ``prompts == batch`` these runs are one wave: no refills, setup inside.

``--sustained-prompts N`` (with ``--sustained-batch B``) then measures sustained throughput:
one engine kept across two calls (as a regeneration worker keeps it), a first wave of B
prompts (cache, captures: ``setup``), then all N prompts timed (``timed``: refills included,
prefill and decode steps split). ``--step-rows R1,R2`` times one decode step alone at those
rows, captured and uncaptured, for each ``--step-attention`` variant, beside the step's
datasheet ceiling (``bench.decode_step``), and one prefill call of the engine's size per cache
layout; ``--profile FILE`` writes the top kernels of that prefill call, of three uncaptured
steps and of three replays there. The JSON is written after every part.

Models: an HF folder; ``gguf:FILE`` (dequantised to a dense model in ``--dtype``, tokenizer
and chat template from the file); ``qwen3_8b_random`` (Qwen3-8B's config, random weights made
on the device; ``--layers N`` cuts it to N decoder layers, for a profile or a compile in a
fraction of the time). Prompts: HumanEval's 164 prompts as a user turn rendered with the chat
template, repeated to ``--prompts`` (the sustained set: HumanEval's, then requests about
documented stdlib APIs, ``decode_common.chat_prompts``); or, with ``--random-prompts MIN:MAX`` (the default for
``qwen3_8b_random`` is 128:512), random token ids with no stop token (every answer runs to
``--max-new-tokens``). Prints the JSON and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from bench.decode_common import (RANDOM_8B, chat_prompts, compare, humaneval_prompts,
                                 random_8b_fields, random_qwen3, sync, timed, write)

RUNS = ("static", "static_eager", "hf", "hf_static")


def load_model(source: str, device: str, dtype: torch.dtype, layers: int | None = None):
    """(model, tokenizer or None) for an HF folder, ``gguf:FILE`` or ``qwen3_8b_random`` (with
    ``layers`` decoder layers where given)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if source == RANDOM_8B:
        return random_qwen3(device, dtype, random_8b_fields(layers)), None
    if source.startswith("gguf:"):
        import transformers

        path = Path(source[len("gguf:"):])
        # transformers 5.24 keeps GGUF weights packed unless asked; 5.17 always dequantises.
        extra = ({"quantization_config": transformers.GgufConfig(dequantize=True)}
                 if hasattr(transformers, "GgufConfig") else {})
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                     dtype=dtype, **extra)
        if getattr(model, "hf_quantizer", None) is not None:
            raise ValueError(f"--model {source}: transformers {transformers.__version__} kept the "
                             "GGUF weights quantized; the bench needs a dense model")
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        return model.to(device).eval(), tokenizer
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).to(device).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError):
        tokenizer = None
    return model, tokenizer


def random_prompts(spec: str, count: int, vocab: int) -> list[list[int]]:
    low, high = (int(x) for x in spec.split(":"))
    if not 1 <= low <= high:
        raise ValueError(f"--random-prompts {spec!r}: want MIN:MAX with 1 <= MIN <= MAX")
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(low, high + 1, (count,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def cut(row: list[int], stops: set[int]) -> list[int]:
    """A row up to and including its first stop token (the rest of a generate row is padding)."""
    at = next((j for j, t in enumerate(row) if t in stops), None)
    return row if at is None else row[:at + 1]


def hf_generate(model, prompts, max_new, stops, batch, pad_id, static_cache=False):
    """HF ``generate`` over left-padded batches of ``batch`` prompts, in the given order."""
    from transformers import GenerationConfig

    extra = {"cache_implementation": "static"} if static_cache else {}
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new,
                              eos_token_id=sorted(stops) or None, pad_token_id=pad_id, **extra)
    answers = []
    for start in range(0, len(prompts), batch):
        group = prompts[start:start + batch]
        width = max(len(p) for p in group)
        ids = torch.full((len(group), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for j, p in enumerate(group):
            ids[j, width - len(p):], mask[j, width - len(p):] = torch.tensor(p), 1
        out = model.generate(ids.to(model.device), attention_mask=mask.to(model.device),
                             generation_config=config)
        answers += [cut(row, stops) for row in out[:, width:].tolist()]
    return answers


def _engine_options(args) -> dict:
    """The static engine's options from the command line, timed (setup apart from decoding)."""
    return dict(sync_every=args.sync_every, refill_rows=args.refill_rows,
                prefill_tokens=args.prefill_tokens,
                attention=args.attention, timing=True, compile_step=args.compile_step,
                compile_prefill=args.compile_prefill)


def run_one(name, model, prompts, max_new, stops, batch, pad_id, args):
    """One run's answers; for the static runs also its engine's split of the time."""
    from pipeline.regen.static_engine import StaticEngine

    if name in ("static", "static_eager"):
        engine = StaticEngine(model, batch, cuda_graphs=name == "static", **_engine_options(args))
        return engine.decode(prompts, max_new, stops), engine.last_stats
    return hf_generate(model, prompts, max_new, stops, batch, pad_id, name == "hf_static"), None


def split(stats: dict, tokens: int) -> dict:
    """The engine's wall seconds split into prefill, graph captures and decode steps. A call
    whose prompts were all too long for the kept cache has only its ``long`` part (the H100's
    80 GB at the 8B shape and 512 rows, 2026-12-05): that part is split instead."""
    if "wall_s" not in stats and "long" in stats:
        return {**split(stats["long"], tokens), "all_decoded_apart": True}
    decode_s = stats["wall_s"] - stats["prefill_s"] - stats["capture_s"]
    return {**{k: round(v, 4) if isinstance(v, float) else v for k, v in stats.items()},
            "decode_s": round(decode_s, 4),
            "decode_tokens_per_s": tokens / decode_s if decode_s > 0 else None,
            "ms_per_step": 1e3 * decode_s / stats["steps"] if stats["steps"] else None}


def load_prompts(args, model, tokenizer):
    """(same-prompts set, sustained set or None, stops, pad id, description)."""
    spec = args.random_prompts or ("128:512" if args.model == RANDOM_8B else None)
    if spec is None and tokenizer is None:
        raise ValueError(f"--model {args.model} has no tokenizer: pass --random-prompts MIN:MAX")
    many = max(args.prompts, args.sustained_prompts)
    if spec:
        everything = random_prompts(spec, many, model.config.vocab_size)
        model.generation_config.eos_token_id = None  # generate must not stop either
        source = {"random": spec}
        stops, pad_id = set(), 0
    else:
        from pipeline.regen.greedy import ensure_pad_token, stop_token_ids

        everything, source = chat_prompts(tokenizer, args.humaneval, many)
        stops = set(stop_token_ids(model, tokenizer))
        pad_id = ensure_pad_token(tokenizer)
    # The same-prompts comparison keeps HumanEval's prompts repeated, as measured before.
    same = (everything[:args.prompts] if spec else
            humaneval_prompts(tokenizer, args.humaneval, args.prompts))
    sustained = everything[:args.sustained_prompts] if args.sustained_prompts else None
    return same, sustained, stops, pad_id, source


def _lengths(prompts) -> dict:
    lengths = [len(p) for p in prompts]
    return {"min": min(lengths), "max": max(lengths), "mean": sum(lengths) / len(lengths)}


def sustained_run(args, model, prompts, stops) -> dict:
    """Many more prompts than rows on one kept engine: setup (cache, captures, a first wave of
    ``--sustained-batch`` prompts) timed apart from the sustained decode of all of them."""
    from pipeline.regen.static_engine import StaticEngine

    rows = args.sustained_batch or args.batch
    engine = StaticEngine(model, rows, **_engine_options(args))
    with torch.no_grad():
        # The longest prompts first: the cache is then sized for every later one (one build).
        wave = sorted(prompts, key=len, reverse=True)[:rows]
        first, setup_s = timed(lambda: engine.decode(wave, args.max_new_tokens, stops),
                               args.device)
        setup = split(engine.last_stats, sum(map(len, first)))
        answers, wall = timed(lambda: engine.decode(prompts, args.max_new_tokens, stops),
                              args.device)
    tokens = sum(map(len, answers))
    result = {"prompts": len(prompts), "batch": rows, "prompt_tokens": _lengths(prompts),
              "tokens_per_s": tokens / wall, "wall_s": wall, "generated_tokens": tokens,
              "mean_answer_tokens": tokens / len(prompts),
              "setup": {"wall_s": setup_s, "first_wave": setup},
              "timed": split(engine.last_stats, tokens), "builds": engine.builds}
    if args.device.startswith("cuda"):
        result["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    engine = None  # its cache freed before the next part allocates
    return result


def measure(args) -> dict:
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    model, tokenizer = load_model(args.model, args.device, dtype, args.layers)
    prompts, sustained, stops, pad_id, source = load_prompts(args, model, tokenizer)
    result = {"model": args.model, "layers": model.config.num_hidden_layers,
              "device": args.device, "dtype": args.dtype, "batch": args.batch,
              "prompts": len(prompts), "prompt_source": source,
              "prompt_tokens": _lengths(prompts), "attention": args.attention,
              "max_new_tokens": args.max_new_tokens, "stops": sorted(stops),
              "torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
              "runs": {}}
    answers = {}
    for name in args.runs:
        with torch.no_grad():
            run_one(name, model, prompts[:args.batch], 4, stops, args.batch, pad_id, args)
            sync(args.device)
            start = time.perf_counter()
            answers[name], stats = run_one(name, model, prompts, args.max_new_tokens, stops,
                                           args.batch, pad_id, args)
            sync(args.device)
            wall = time.perf_counter() - start
        tokens = sum(len(a) for a in answers[name])
        result["runs"][name] = {"tokens_per_s": tokens / wall, "wall_s": wall,
                                "generated_tokens": tokens}
        if stats is not None:
            result["runs"][name]["split"] = split(stats, tokens)
        if args.device.startswith("cuda"):
            result["runs"][name]["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        if "hf" in answers:
            for other in answers:
                if other != "hf":
                    result["runs"][other].update(compare(answers["hf"], answers[other]))
        write(args.out, result)
    if "static" in answers and "static_eager" in answers:
        same = sum(a == b for a, b in zip(answers["static"], answers["static_eager"]))
        result["runs"]["static_eager"]["identical_to_static"] = same / len(prompts)
    if sustained is not None:
        result["sustained"] = sustained_run(args, model, sustained, stops)
        write(args.out, result)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    for rows in args.step_rows:
        from bench.decode_step import step_timing

        profile = args.profile if rows == args.step_rows[0] else None
        result.setdefault("step", {})[str(rows)] = step_timing(
            model, sustained or prompts, rows, args.step_attention, profile=profile,
            compile_prefill=args.compile_prefill)
        write(args.out, result)
    return result


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> dict:
    from bench.decode_step import VARIANTS
    from pipeline.regen.static_attention import ATTENTIONS, ROW_LENGTHS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="HF folder, gguf:FILE or qwen3_8b_random")
    p.add_argument("--layers", type=int, default=None,
                   help=f"{RANDOM_8B} only: the 8B shape with this many decoder layers (36): "
                        "a profile or a compile in a fraction of the time, each layer's "
                        "kernels as in the whole model")
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--runs", default="static,static_eager,hf",
                   help=f"comma-separated, from {', '.join(RUNS)}")
    p.add_argument("--random-prompts", default=None, metavar="MIN:MAX")
    p.add_argument("--sync-every", type=int, default=8)
    p.add_argument("--refill-rows", type=int, default=None, help="default: 1/8 of the rows")
    p.add_argument("--prefill-tokens", type=int, default=16384,
                   help="padded tokens of one prefill call at most (the engine's default)")
    p.add_argument("--attention", choices=ATTENTIONS, default="sdpa",
                   help="the static engine's decode-step attention")
    p.add_argument("--compile-step", action="store_true",
                   help="the static engine's decode step through torch.compile "
                        "(varlen or triton only)")
    p.add_argument("--compile-prefill", action="store_true",
                   help="the static engine's prefills through torch.compile (symbolic shapes)")
    p.add_argument("--sustained-prompts", type=int, default=0,
                   help="also decode this many prompts on one kept engine (0: off)")
    p.add_argument("--sustained-batch", type=int, default=0, help="its rows (0: --batch)")
    p.add_argument("--step-rows", type=_ints, default=[],
                   help="comma-separated row counts to time one decode step at (bench.decode_step)")
    p.add_argument("--step-attention", default="sdpa,matmul,flex,varlen,triton",
                   help=f"step variants the step timing compares, from {', '.join(VARIANTS)}")
    p.add_argument("--profile", type=Path, default=None,
                   help="write the top kernels of a few decode steps (first --step-rows) here")
    p.add_argument("--humaneval", default=None, help="HumanEval.jsonl.gz (models with a tokenizer)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    args.runs = [r for r in args.runs.split(",") if r]
    bad = [r for r in args.runs if r not in RUNS]
    if bad:
        p.error(f"--runs {','.join(bad)}: allowed {', '.join(RUNS)}")
    args.step_attention = [a for a in args.step_attention.split(",") if a]
    wrong = [a for a in args.step_attention if a not in VARIANTS]
    if wrong or not args.step_attention:
        p.error(f"--step-attention {','.join(wrong) or '(empty)'}: allowed {', '.join(VARIANTS)}")
    if args.compile_step and args.attention not in ROW_LENGTHS:
        p.error(f"--compile-step needs --attention {' or '.join(ROW_LENGTHS)}, "
                f"not {args.attention}")
    if args.layers is not None and (args.model != RANDOM_8B or args.layers < 1):
        p.error(f"--layers {args.layers}: a count of 1 or more, with --model {RANDOM_8B} only")
    if args.profile is not None and not args.step_rows:
        p.error("--profile profiles the step timing: give --step-rows too")
    result = measure(args)
    print(json.dumps(result, indent=1))
    write(args.out, result)
    return result


def failed_variants(result: dict) -> list[str]:
    """``rows:variant`` for each step variant that gave an error instead of a figure."""
    return [f"{rows}:{name}" for rows, timing in result.get("step", {}).items()
            for name, figures in timing["variants"].items() if "error" in figures]


if __name__ == "__main__":
    failed = failed_variants(main())
    if failed:  # the other figures are written; the run still says it is incomplete
        sys.exit(f"decode_static: no figure for {', '.join(failed)} (see the error in the output)")
