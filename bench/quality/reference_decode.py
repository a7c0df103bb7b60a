"""tau of an exported drafter as DFlash's published inference code decodes it (issue 25 item 2).

The pipeline's evaluator (pipeline/eval/speculative.py) re-reads every tap feature each round
through the training-side drafter. This loop is written apart from it, the way z-lab's
``spec_generate`` drives its drafter: the export is loaded by ``AutoModel`` with
``trust_remote_code`` (its own ``modeling_dflash.py``), and the drafter keeps a KV cache of the
context, is given only the tap features of tokens accepted since its last call, and has its
block's entries cropped after each call; the target keeps a ``DynamicCache`` cropped to the
accepted text. So the bench's ``tau_reference_code`` checks the export, its cache path and the
calling convention against the evaluator's tau on the same prompts. Greedy, one prompt at a
time; targets whose cache can be cropped (full attention: Qwen3, Llama, Mistral).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch


@dataclass
class Decoded:
    tokens: list[int] = field(default_factory=list)     # new tokens, greedy
    accepted: list[int] = field(default_factory=list)   # drafted tokens accepted per round
    drafts: list[list[int]] = field(default_factory=list)  # what each round drafted


def _taps(hidden_states: Sequence[torch.Tensor], layer_ids: Sequence[int]) -> torch.Tensor:
    # hidden_states[0] is the embedding output: layer i's output is entry i + 1.
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


def _crop_to(cache, length: int) -> None:
    # "Drop this many" (a negative count): the form every transformers version takes; a
    # positive "keep this many" is refused by newer ones.
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


@torch.no_grad()
def decode(target, draft, prompt: Sequence[int], max_new_tokens: int,
           eos_token_id: Optional[int] = None) -> Decoded:
    """Greedy speculative decoding of ``prompt`` by ``target`` (an HF causal LM) with
    ``draft`` (the export, as ``AutoModel`` loads it)."""
    from transformers import DynamicCache

    from pipeline.model.cache_keyword import cache_keyword

    dev = next(target.parameters()).device
    cache_kw = cache_keyword(target)  # "cache" where the old name draws a FutureWarning
    size, layer_ids = draft.block_size, draft.target_layer_ids
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    target_cache, draft_cache = DynamicCache(), DynamicCache()
    ids = torch.tensor([list(prompt)], device=dev)
    out = target(input_ids=ids, use_cache=True, output_hidden_states=True,
                 **{cache_kw: target_cache})
    new_features = _taps(out.hidden_states, layer_ids)
    tokens = list(prompt) + [int(out.logits[0, -1].argmax())]
    in_draft_cache = 0  # context positions the drafter's cache holds
    result = Decoded()
    while len(tokens) - len(prompt) < max_new_tokens and tokens[-1] != eos_token_id:
        start = len(tokens) - 1  # the block's first position: the last token, known
        block = torch.full((1, size), draft.mask_token_id, device=dev)
        block[0, 0] = tokens[-1]
        positions = torch.arange(in_draft_cache, start + size, device=dev)[None]
        hidden = draft(position_ids=positions, noise_embedding=embed(block),
                       target_hidden=new_features, past_key_values=draft_cache, use_cache=True)
        _crop_to(draft_cache, start)  # keep the context, drop the block's keys
        in_draft_cache = start
        drafted = lm_head(hidden[:, 1:]).argmax(-1)[0]
        verify = torch.cat([block[0, :1], drafted])[None]
        out = target(input_ids=verify, use_cache=True, output_hidden_states=True,
                     **{cache_kw: target_cache})
        posterior = out.logits[0].argmax(-1)
        n = int((drafted == posterior[:-1]).long().cumprod(0).sum())
        result.drafts.append(drafted.tolist())
        result.accepted.append(n)
        tokens += drafted[:n].tolist() + [int(posterior[n])]
        _crop_to(target_cache, start + n + 1)
        new_features = _taps(out.hidden_states, layer_ids)[:, :n + 1]
        if eos_token_id is not None and eos_token_id in tokens[start + 1:]:
            break
    new = tokens[len(prompt):]
    result.tokens = new[:new.index(eos_token_id) + 1] if eos_token_id in new else new
    return result


def tau(results: Sequence[Decoded]) -> float:
    """Mean over all rounds of all prompts of (accepted + 1)."""
    rounds = [n + 1 for r in results for n in r.accepted]
    return sum(rounds) / len(rounds) if rounds else float("nan")


def acceptance(results: Sequence[Decoded], block_size: int) -> dict:
    """tau (None without a round), the rounds, and per block position k the share of rounds
    that accepted at least k drafts."""
    rounds = [n for r in results for n in r.accepted]
    share = [round(sum(n >= k for n in rounds) / len(rounds), 4) if rounds else None
             for k in range(1, block_size)]
    return {"tau": round(tau(results), 4) if rounds else None, "rounds": len(rounds),
            "accepted_at_position": share}


def export_tau(target_dir: str, export_dir: str, heldout_path: str, prompts: int,
               max_new_tokens: int, device: str, dtype: torch.dtype = torch.bfloat16,
               enable_thinking: bool = True) -> float:
    """tau of the export in ``export_dir`` with the target in ``target_dir`` on the first
    ``prompts`` held-out prompts (the evaluator's prompts: pipeline.eval.tau.heldout_prompts)."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    from pipeline.eval.tau import heldout_prompts

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).to(device).eval()
    draft = AutoModel.from_pretrained(export_dir, trust_remote_code=True, dtype=dtype)
    draft = draft.to(device).eval()
    ids = heldout_prompts(heldout_path, tokenizer, prompts, enable_thinking=enable_thinking)
    return tau([decode(target, draft, p, max_new_tokens, tokenizer.eos_token_id) for p in ids])
