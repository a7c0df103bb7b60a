"""Greedy (T=0) answers of a target to single-turn prompts: the demo's assistant turns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class Continuation:
    token_ids: list[int]  # generated tokens, without the token that stopped the turn
    stopped: bool  # True if the target ended its turn, False if max_new_tokens cut it


def stop_token_ids(tokenizer) -> list[int]:
    """Tokens that end an answer: the eos (end of turn), and pad/turn-start if ever produced."""
    ids = [tokenizer.eos_token_id, tokenizer.pad_token_id,
           tokenizer.convert_tokens_to_ids("<|im_start|>")]
    return sorted({i for i in ids if i is not None and i != tokenizer.unk_token_id})


def chat_prompt(tokenizer, user_text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": user_text}],
                                         tokenize=False, add_generation_prompt=True)


@torch.no_grad()
def greedy_continuations(model, tokenizer, user_texts: Sequence[str], max_new_tokens: int,
                         batch_size: int) -> list[Continuation]:
    """Greedy answers, ``batch_size`` prompts at a time, in order.

    Prompts are left-padded so every row's answer starts at the same column; HF derives the
    position ids from the attention mask, so padding does not shift positions.
    """
    stops = stop_token_ids(tokenizer)
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        out = []
        for i in range(0, len(user_texts), batch_size):
            prompts = [chat_prompt(tokenizer, t) for t in user_texts[i:i + batch_size]]
            enc = tokenizer(prompts, add_special_tokens=False, padding=True,
                            return_tensors="pt")
            generated = model.generate(
                **enc, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=stops,
                pad_token_id=tokenizer.pad_token_id)
            new = generated[:, enc["input_ids"].shape[1]:].tolist()
            out.extend(_cut(row, stops) for row in new)
        return out
    finally:
        tokenizer.padding_side = side


def _cut(row: list[int], stops: list[int]) -> Continuation:
    for j, token in enumerate(row):
        if token in stops:
            return Continuation(row[:j], True)
    return Continuation(row, False)
