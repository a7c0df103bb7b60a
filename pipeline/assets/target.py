"""The tiny target: a real HF Qwen3 causal LM, trained until it nearly memorises its text.

Training sequences are built in token space, already in chat form::

    <|im_start|>user\\n {U tokens of help text} <|im_end|>\\n<|im_start|>assistant\\n
    {the A tokens that follow} <|im_end|>\\n

U and A are drawn per batch, so a batch has no padding and the model learns to answer a
prompt by continuing it, and to end its turn.
"""

from __future__ import annotations

import logging
import math

import torch

from pipeline.assets.recipe import TinyRecipe

log = logging.getLogger(__name__)


def build_target(recipe: TinyRecipe, tokenizer):
    """A freshly initialised Qwen3ForCausalLM sized by the recipe (seed it before calling).

    Any record with the recipe's size fields will do (bench/quality's Scale uses it too).
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads, num_key_value_heads=recipe.num_kv_heads,
        head_dim=recipe.head_dim, max_position_embeddings=recipe.max_position_embeddings,
        rope_theta=recipe.rope_theta, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    return Qwen3ForCausalLM(config)


def chat_pieces(tokenizer) -> tuple[list[int], list[int], list[int]]:
    """Token ids the chat template puts before the user text, between the turns, and after."""
    user, answer = "\x00USER\x00", "\x00ANSWER\x00"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
        tokenize=False)
    head, rest = text.split(user)
    middle, tail = rest.split(answer)

    def encode(s: str) -> list[int]:
        return tokenizer(s, add_special_tokens=False)["input_ids"]

    return encode(head), encode(middle), encode(tail)


def _chat_batch(stream: torch.Tensor, pieces: tuple[list[int], ...], recipe: TinyRecipe,
                generator: torch.Generator) -> torch.Tensor:
    """[B, S] chat sequences cut from random places of the token stream."""
    def draw(lo_hi: tuple[int, int]) -> int:
        return int(torch.randint(lo_hi[0], lo_hi[1] + 1, (), generator=generator))

    n_user, n_answer = draw(recipe.user_tokens), draw(recipe.assistant_tokens)
    head, middle, tail = (torch.tensor(p, dtype=torch.long) for p in pieces)
    starts = torch.randint(0, len(stream) - n_user - n_answer, (recipe.train_batch_size,),
                           generator=generator)
    rows = []
    for s in starts.tolist():
        user = stream[s:s + n_user]
        answer = stream[s + n_user:s + n_user + n_answer]
        rows.append(torch.cat([head, user, middle, answer, tail]))
    return torch.stack(rows)


def _lr_at(step: int, recipe: TinyRecipe) -> float:
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.train_steps - recipe.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return recipe.lr * (recipe.min_lr_ratio + (1 - recipe.min_lr_ratio) * cosine)


def train_target(model, tokenizer, stream: torch.Tensor, recipe: TinyRecipe) -> list[float]:
    """Train in place with AdamW on chat-formed windows of ``stream``; returns the losses."""
    generator = torch.Generator().manual_seed(recipe.seed)
    pieces = chat_pieces(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95),
                                  weight_decay=0.0)
    model.train()
    losses = []
    for step in range(recipe.train_steps):
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, recipe)
        batch = _chat_batch(stream, pieces, recipe, generator)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 50 == 0 or step == recipe.train_steps - 1:
            log.info("tiny target step %d/%d loss %.3f", step, recipe.train_steps, losses[-1])
    model.eval()
    return losses
