"""Greedy decoding throughput: the static-cache engine against HF ``generate``, same prompts.

    python -m bench.decode_static --model gguf:SmolLM2-135M-Instruct.Q4_1.gguf --humaneval HumanEval.jsonl.gz \
        --prompts 512 --max-new-tokens 256 --batch 512 --device cuda --out /tmp/decode_smol.json
    python -m bench.decode_static --model qwen3_8b_random --prompts 512 --max-new-tokens 256 \
        --batch 256 --device cuda --out /tmp/decode_8b.json

Runs (``--runs``, in order): ``static`` (pipeline.regen.static_decoder with CUDA graphs), ``static_eager``
(the same, uncaptured), ``hf`` (``generate``, left-padded batches of ``--batch``) and
``hf_static`` (``generate`` with ``cache_implementation="static"``; off by default). Each
reports generated tokens (answers cut after their first stop token, stop included), wall
seconds and tokens/s after one untimed warm-up on a batch of 4-token answers; every run but
``hf`` also reports the share of answers identical to ``hf``'s and, for the first mismatches,
the first differing position (bf16 ties differ late; a wrong cache position differs early).

Models: an HF folder; ``gguf:FILE`` (dequantised to a dense model in ``--dtype``, tokenizer
and chat template from the file); ``qwen3_8b_random`` (Qwen3-8B's config, random weights made
on the device). Prompts: HumanEval's 164 prompts as a user turn rendered with the chat
template, repeated to ``--prompts``; or, with ``--random-prompts MIN:MAX`` (the default for
``qwen3_8b_random`` is 128:512), random token ids with no stop token (every answer runs to
``--max-new-tokens``). Prints the JSON and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bench.decode_common import RANDOM_8B, compare, humaneval_prompts, random_qwen3, sync

RUNS = ("static", "static_eager", "hf", "hf_static")


def load_model(source: str, device: str, dtype: torch.dtype):
    """(model, tokenizer or None) for an HF folder, ``gguf:FILE`` or ``qwen3_8b_random``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if source == RANDOM_8B:
        return random_qwen3(device, dtype), None
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


def run_one(name, model, prompts, max_new, stops, batch, pad_id, sync_every):
    from pipeline.regen.static_decoder import greedy_decode

    if name in ("static", "static_eager"):
        return greedy_decode(model, prompts, max_new, stops, batch_size=batch,
                             cuda_graphs=name == "static", sync_every=sync_every)
    return hf_generate(model, prompts, max_new, stops, batch, pad_id, name == "hf_static")


def measure(args) -> dict:
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    model, tokenizer = load_model(args.model, args.device, dtype)
    spec = args.random_prompts or ("128:512" if args.model == RANDOM_8B else None)
    if spec is None and tokenizer is None:
        raise ValueError(f"--model {args.model} has no tokenizer: pass --random-prompts MIN:MAX")
    if spec:
        prompts, stops = random_prompts(spec, args.prompts, model.config.vocab_size), set()
        model.generation_config.eos_token_id = None  # generate must not stop either
        pad_id = 0
    else:
        from pipeline.regen.greedy import ensure_pad_token, stop_token_ids

        prompts = humaneval_prompts(tokenizer, args.humaneval, args.prompts)
        stops = set(stop_token_ids(model, tokenizer))
        pad_id = ensure_pad_token(tokenizer)
    lengths = [len(p) for p in prompts]
    result = {"model": args.model, "device": args.device, "dtype": args.dtype, "batch": args.batch,
              "prompts": len(prompts), "prompt_source": f"random {spec}" if spec else "humaneval chat",
              "prompt_tokens": {"min": min(lengths), "max": max(lengths),
                                "mean": sum(lengths) / len(lengths)},
              "max_new_tokens": args.max_new_tokens, "stops": sorted(stops),
              "torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
              "runs": {}}
    answers = {}
    for name in args.runs:
        with torch.no_grad():
            run_one(name, model, prompts[:args.batch], 4, stops, args.batch, pad_id, args.sync_every)
            sync(args.device)
            start = time.perf_counter()
            answers[name] = run_one(name, model, prompts, args.max_new_tokens, stops, args.batch,
                                    pad_id, args.sync_every)
            sync(args.device)
            wall = time.perf_counter() - start
        tokens = sum(len(a) for a in answers[name])
        result["runs"][name] = {"tokens_per_s": tokens / wall, "wall_s": wall,
                                "generated_tokens": tokens}
        if args.device.startswith("cuda"):
            result["runs"][name]["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    if "hf" in answers:
        for name in answers:
            if name != "hf":
                result["runs"][name].update(compare(answers["hf"], answers[name]))
    if "static" in answers and "static_eager" in answers:
        same = sum(a == b for a, b in zip(answers["static"], answers["static_eager"]))
        result["runs"]["static_eager"]["identical_to_static"] = same / len(prompts)
    return result


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="HF folder, gguf:FILE or qwen3_8b_random")
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--runs", default="static,static_eager,hf",
                   help=f"comma-separated, from {', '.join(RUNS)}")
    p.add_argument("--random-prompts", default=None, metavar="MIN:MAX")
    p.add_argument("--sync-every", type=int, default=8)
    p.add_argument("--humaneval", default=None, help="HumanEval.jsonl.gz (models with a tokenizer)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    args.runs = [r for r in args.runs.split(",") if r]
    bad = [r for r in args.runs if r not in RUNS]
    if bad or not args.runs:
        p.error(f"--runs {','.join(bad) or '(empty)'}: allowed {', '.join(RUNS)}")
    result = measure(args)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
