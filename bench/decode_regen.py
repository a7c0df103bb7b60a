"""Decode speed of regeneration: transformers' continuous batching against plain ``generate``.

    python -m bench.decode_regen --model /models/SmolLM2-135M-Instruct --prompts 512 \\
        --max-new-tokens 256 --batch 512 --device cuda --out smol.json
    python -m bench.decode_regen --model qwen3_8b_random --prompts 512 --max-new-tokens 256 \\
        --batch 128 --device cuda --out qwen3_8b.json --sweep
    python -m bench.decode_regen --model qwen3_tiny_random --prompts 8 --max-new-tokens 8 \\
        --batch 4 --device cpu --out /tmp/tiny.json       # seconds, on CPU

Both engines decode the SAME prompts greedily in one process: the continuous-batching engine
exactly as ``pipeline.regenerate --engine cb`` drives it (:class:`pipeline.regen.cb.CbSession`),
and ``generate`` on left-padded batches of ``--batch``. Reported: generated tokens (each answer
up to, not including, its stop token), wall seconds and tokens/s of each, and the share of
answers identical between the two, with the first differing position of the first mismatches
(in bf16 a near-tie can flip a token; a wrong cache position shows up as a mismatch at 0 or at
a page boundary, on every prompt). Each engine first runs a few prompts untimed (warm-up:
cache allocation, compilation, CUDA graphs), reported apart.

Models: an HF folder (with its tokenizer: HumanEval prompts rendered with its chat template;
``--gguf-file`` loads a GGUF inside it), or a shape built on the device with random weights
and token-id prompts, no tokenizer and no early stop: ``qwen3_8b_random`` (Qwen3-8B's config)
or ``qwen3_tiny_random`` (for CPU tests). ``--sweep`` tries a few engine settings on top of the
``--cb-*`` flags, one after another in the same process, and reports each.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import random
import sys
from typing import Optional, Sequence

import torch
from transformers import GenerationConfig

from bench.decode_common import compare, humaneval_prompts, random_qwen3, timed
from pipeline.regen.cb import COMPILE_LEVELS, SWITCHES, CbOptions, CbSession
from pipeline.regen.greedy import stop_token_ids

log = logging.getLogger(__name__)

SHAPES = {
    "qwen3_8b_random": None,  # pipeline.model.config.qwen3_8b_config()
    "qwen3_tiny_random": dict(vocab_size=512, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=16,
                              max_position_embeddings=1024),
}
# Tried by --sweep, each on top of the --cb-* flags.
SWEEP = ({}, {"cuda_graphs": "off"}, {"cuda_graphs": "on"}, {"compile_level": 1},
         {"async_batching": "on"})


def load_model(source: str, device: str, dtype: torch.dtype, gguf_file: Optional[str] = None,
               attn_implementation: Optional[str] = None):
    """(model, tokenizer or None) on ``device``: an HF folder, or a random-weight shape."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if source in SHAPES:
        model = random_qwen3(device, dtype, SHAPES[source])
        if attn_implementation:
            model.set_attn_implementation(attn_implementation)
        return model, None
    kw = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(source, **kw)
    if attn_implementation:
        kw["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kw)
    return model.to(device).eval(), tokenizer


def build_prompts(tokenizer, count: int, vocab_size: int,
                  humaneval: Optional[str] = None) -> list[list[int]]:
    """HumanEval prompts through the chat template (repeated to ``count``), or, without a
    tokenizer, token ids of 32 to 160 tokens drawn with a fixed seed."""
    if tokenizer is None:
        rng = random.Random(0)
        return [[rng.randrange(1, vocab_size) for _ in range(32 + rng.randrange(129))]
                for _ in range(count)]
    return humaneval_prompts(tokenizer, humaneval, count)


def cut(row: Sequence[int], stops: Sequence[int]) -> list[int]:
    """The answer up to its first stop token (as pipeline.regen.greedy.cut_at_stop counts)."""
    stop_at = next((j for j, t in enumerate(row) if t in stops), None)
    return list(row if stop_at is None else row[:stop_at])


@torch.no_grad()
def generate_answers(model, prompts: list[list[int]], config: GenerationConfig, batch: int,
                     pad_id: int) -> list[list[int]]:
    """Plain ``generate`` on left-padded batches of ``batch`` prompts (the baseline)."""
    out = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in chunk],
                           device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk],
                            device=model.device)
        rows = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        out.extend(rows[:, width:].tolist())
    return out


def _resolved(session: CbSession) -> dict:
    """The engine's settings after the library filled in its automatic ones (on the kept
    manager's own copy of the config)."""
    manager = getattr(session.model, "_cached_continuous_batching_manager", None)
    config = getattr(manager, "continuous_batching_config", session.cb_config)
    keys = ("num_blocks", "max_batch_tokens", "max_requests_per_batch", "page_size",
            "block_size", "use_cuda_graph", "use_async_batching", "default_compile_level",
            "max_memory_percent", "max_blocks_per_request")
    found = {k: repr(getattr(config, k)) for k in keys if hasattr(config, k)}
    # Read before close(): the engine runs on a paged attention, restored afterwards.
    found["attn_implementation"] = session.model.config._attn_implementation
    return found


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def run_cb(model, tokenizer, prompts, config, stops, options: CbOptions, device: str,
           reference: list[list[int]]) -> dict:
    # A copy: the library writes into the config it is given (eos None becomes -1).
    session = CbSession(model, tokenizer, copy.deepcopy(config), stops, options,
                        enable_thinking=True)
    try:
        _, warm_s = timed(lambda: session.decode_ids(prompts[:8]), device)
        rows, wall = timed(lambda: session.decode_ids(prompts), device)
        resolved = _resolved(session)
    finally:
        session.close()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    answers = [cut(r, stops) for r in rows]
    tokens = sum(map(len, answers))
    return {"options": options.describe(), "resolved": resolved, "warmup_s": warm_s,
            "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall,
            **compare(reference, answers), "answers": answers}


def run_bench(model_source: str, prompts: int, max_new_tokens: int, batch: int, device: str,
              dtype: torch.dtype = torch.bfloat16, options: CbOptions = CbOptions(),
              sweep: bool = False, gguf_file: Optional[str] = None,
              attn_implementation: Optional[str] = None,
              humaneval: Optional[str] = None) -> dict:
    """Both engines on the same prompts; the figures as a dict (see the module docstring)."""
    import transformers

    model, tokenizer = load_model(model_source, device, dtype, gguf_file, attn_implementation)
    ids = build_prompts(tokenizer, prompts, model.config.vocab_size, humaneval)
    stops = stop_token_ids(model, tokenizer) if tokenizer is not None else []
    pad_id = (tokenizer.pad_token_id if tokenizer is not None
              and tokenizer.pad_token_id is not None else (stops or [0])[0])
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                              eos_token_id=list(stops) or None, pad_token_id=pad_id)
    timed(lambda: generate_answers(model, ids[:min(batch, 8)], config, batch, pad_id), device)
    rows, gen_wall = timed(lambda: generate_answers(model, ids, config, batch, pad_id), device)
    reference = [cut(r, stops) for r in rows]
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    settings = [dataclasses.replace(options, **change) for change in (SWEEP if sweep else [{}])]
    runs = []
    for setting in settings:
        log.info("cb engine with %s", setting.describe())
        try:
            runs.append(run_cb(model, tokenizer, ids, config, stops, setting, device, reference))
        except Exception as e:  # one failing setting must not hide the others' figures
            log.exception("cb setting %s failed", setting.describe())
            runs.append({"options": setting.describe(), "error": f"{type(e).__name__}: {e}"})
    first = runs[0]
    gen_tokens = sum(map(len, reference))
    result = {
        "model": model_source, "device": device, "dtype": str(dtype).replace("torch.", ""),
        "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None,
        "transformers": transformers.__version__, "torch": torch.__version__,
        "attn_implementation": model.config._attn_implementation,
        "flash_attn_installed": _installed("flash_attn"),
        "prompts": prompts, "max_new_tokens": max_new_tokens, "batch": batch,
        "prompt_tokens_mean": sum(map(len, ids)) / len(ids), "stop_ids": stops,
        "hf_generate_tokens_per_s": gen_tokens / gen_wall, "hf_generate_tokens": gen_tokens,
        "hf_generate_wall_s": gen_wall,
        "regen_tokens_per_s": first.get("tokens_per_s"), "regen_tokens": first.get("tokens"),
        "regen_wall_s": first.get("wall_s"), "regen_warmup_s": first.get("warmup_s"),
        "identical_share": first.get("identical_share"),
        "first_mismatches": first.get("first_mismatches"),
        "cb_runs": [{k: v for k, v in r.items() if k != "answers"} for r in runs],
    }
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.decode_regen",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help=f"HF folder, or one of {sorted(SHAPES)}")
    p.add_argument("--gguf-file", default=None, help="a GGUF file inside --model to load")
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch", type=int, default=512, help="generate's padded batch")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                   help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--attn-implementation", default=None,
                   help="e.g. sdpa, flash_attention_2 (the engine pages it: paged|...)")
    p.add_argument("--humaneval", default=None, help="HumanEval.jsonl.gz (models with a tokenizer)")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--sweep", action="store_true", help="also try the SWEEP settings")
    p.add_argument("--cb-max-batch-tokens", type=int, default=None)
    p.add_argument("--cb-num-blocks", type=int, default=None)
    p.add_argument("--cb-max-requests", type=int, default=None)
    p.add_argument("--cb-page-size", type=int, default=None)
    p.add_argument("--cb-max-memory-percent", type=float, default=None)
    p.add_argument("--cb-cuda-graphs", choices=SWITCHES, default="auto")
    p.add_argument("--cb-compile-level", type=int, choices=COMPILE_LEVELS, default=0)
    p.add_argument("--cb-async-batching", choices=SWITCHES, default="auto")
    return p


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda")
                                          else "float32"))
    options = CbOptions(max_batch_tokens=args.cb_max_batch_tokens,
                        num_blocks=args.cb_num_blocks, max_requests=args.cb_max_requests,
                        page_size=args.cb_page_size,
                        max_memory_percent=args.cb_max_memory_percent,
                        cuda_graphs=args.cb_cuda_graphs, compile_level=args.cb_compile_level,
                        async_batching=args.cb_async_batching)
    result = run_bench(args.model, args.prompts, args.max_new_tokens, args.batch, args.device,
                       dtype, options, args.sweep, args.gguf_file, args.attn_implementation,
                       args.humaneval)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    for run in result["cb_runs"]:
        print(json.dumps({k: run.get(k) for k in ("options", "resolved", "tokens_per_s",
                                                  "warmup_s", "identical_share", "error")}))
    print(f"decode_regen: generate {result['hf_generate_tokens_per_s']:.0f} tok/s, "
          f"cb {result['regen_tokens_per_s'] or 0:.0f} tok/s, identical "
          f"{result['identical_share']} -> {args.out}")
    return result


if __name__ == "__main__":
    # A failed first engine setting is a failed benchmark, even with the JSON written.
    sys.exit(1 if "error" in main()["cb_runs"][0] else 0)
