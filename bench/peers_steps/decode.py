"""Every export decoded by the one decoder, with the lossless check (run apart, in the project's
environment, after a trainer has left the device).

    python -m bench.peers_steps.decode --spec SPEC.json --out RESULT.json

The decoder is bench/quality/reference_decode.py (z-lab's calling convention, the export loaded
by ``AutoModel`` with ``trust_remote_code``). For each set (HumanEval, held-out explain) and
export: tau, the share of rounds accepting at least k drafts, and the lossless check: the
decoded tokens against the target's own greedy decoding of the same prompt (computed once per
set and kept in ``greedy_cache``). In bf16 on a GPU a verify step over a block and a one-token
step may round a near tie apart, so the check counts the prompts that match and where the first
that does not diverges, rather than failing the run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


@torch.no_grad()
def greedy(target, prompt: list[int], max_new_tokens: int, eos: int | None) -> list[int]:
    """The target alone, one token at a time, with its cache (the plain greedy answer)."""
    from transformers import DynamicCache

    from pipeline.model.cache_keyword import cache_keyword

    dev = next(target.parameters()).device
    cache, kw = DynamicCache(), cache_keyword(target)
    ids = torch.tensor([prompt], device=dev)
    out = []
    while len(out) < max_new_tokens:
        logits = target(input_ids=ids, use_cache=True, **{kw: cache}).logits
        token = int(logits[0, -1].argmax())
        out.append(token)
        if token == eos:
            break
        ids = torch.tensor([[token]], device=dev)
    return out


def lossless(decoded, plain: list[list[int]], max_new_tokens: int) -> dict:
    """Each decoded answer against the target's own, over the target's length (a last round
    may accept past ``max_new_tokens``; both stop at the end-of-turn token)."""
    answers = [d.tokens[:max_new_tokens] for d in decoded]
    same = [a == p for a, p in zip(answers, plain)]
    first = None
    for a, p in zip(answers, plain):
        if a != p:
            first = next((i for i, (x, y) in enumerate(zip(a, p)) if x != y),
                         min(len(a), len(p)))
            break
    return {"prompts": len(same), "equal": sum(same), "lossless": all(same),
            "first_divergence_at_token": first}


def run(spec: dict) -> dict:
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    from bench.quality.reference_decode import acceptance, decode
    from pipeline.eval.tau import heldout_prompts

    device = spec["device"]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(spec["target"])
    target = AutoModelForCausalLM.from_pretrained(spec["target"], dtype=dtype).to(device).eval()
    eos, n_new = tokenizer.eos_token_id, spec["max_new_tokens"]
    prompts = {name: heldout_prompts(path, tokenizer, spec["prompts"])
               for name, path in spec["sets"].items()}
    cache_path = Path(spec["greedy_cache"])
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    key = f"{device}:{n_new}:{spec['prompts']}"
    if key not in cache:
        cache[key] = {name: [greedy(target, p, n_new, eos) for p in ids]
                      for name, ids in prompts.items()}
        cache_path.write_text(json.dumps(cache))
    plain = cache[key]
    results = {}
    for label, folder in spec["exports"].items():
        t0 = time.perf_counter()
        draft = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=dtype)
        draft = draft.to(device).eval()
        row = {}
        for name, ids in prompts.items():
            decoded = [decode(target, draft, p, n_new, eos) for p in ids]
            row[name] = {**acceptance(decoded, draft.block_size),
                         "check": lossless(decoded, plain[name], n_new)}
        row["decode_s"] = round(time.perf_counter() - t0, 1)
        results[label] = row
        del draft
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    Path(args.out).write_text(json.dumps(run(spec), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
