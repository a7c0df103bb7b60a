"""Batched greedy decoding of whole conversations, turn by turn.

Multi-turn choice: every assistant turn is regenerated, in order, and later prompts see the
*regenerated* earlier answers, so each training sample is a conversation the target itself
could have had. A batch of conversations is decoded in rounds: round ``k`` generates the
``k``-th assistant turn of every conversation that has one, all in one left-padded call.
A conversation that ends with a user (or tool) turn, such as a prompts-only line, gets the
answer to it appended as a last assistant turn. System, user and tool turns are kept verbatim.

Storage choice: an answer is stored as the exact text the target wrote, reasoning included
(Qwen3: ``<think>\n...\n</think>\n\nanswer``), as the message's ``content``. Qwen3's template
splits such content back into reasoning and answer itself, and other templates render it as
it is, so the stored turn re-renders to what was generated; each turn is checked for that.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import torch
from transformers import GenerationConfig

from pipeline.data.encode import generated_text
from pipeline.data.template import render
from pipeline.regen.messages import GenRequest, Message, TurnResult


def stop_token_ids(model, tokenizer) -> list[int]:
    """Tokens that end a turn: the generation config's eos (Qwen3 lists two) and the tokenizer's."""
    configured = model.generation_config.eos_token_id
    ids = list(configured) if isinstance(configured, (list, tuple)) else [configured]
    ids.append(tokenizer.eos_token_id)
    return sorted({int(i) for i in ids if i is not None})


def greedy_config(stops: Sequence[int], pad_id: int, max_new_tokens: int) -> GenerationConfig:
    """A clean greedy config: the target's own sampling defaults (temperature, top_p) are not
    wanted here, and leaving them set only makes generate() warn that they are ignored."""
    return GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                            eos_token_id=list(stops), pad_token_id=pad_id)


def render_prompt(tokenizer, messages: Sequence[Message], enable_thinking: bool = True) -> str:
    """The conversation so far, ending with the header of the assistant turn to generate."""
    return render(tokenizer, messages, add_generation_prompt=True,
                  enable_thinking=enable_thinking)


def round_trips(tokenizer, messages: Sequence[Message], index: int, answer: str,
                stops: Sequence[int], enable_thinking: bool) -> bool:
    """Whether the stored turn ``messages[index]`` re-renders as ``answer`` plus one stop token:
    what the target generated, so that training supervises exactly that."""
    try:
        _, generated = generated_text(tokenizer, messages, index, enable_thinking)
    except ValueError:
        return False
    if not generated.startswith(answer):
        return False
    rest = tokenizer(generated[len(answer):], add_special_tokens=False)["input_ids"]
    return len(rest) == 1 and rest[0] in stops


@torch.no_grad()
def greedy_batch(model, tokenizer, prompts: Sequence[str], config: GenerationConfig,
                 stops: Sequence[int]) -> list[TurnResult]:
    """Greedy answers to rendered prompts, in one left-padded ``generate`` call.

    Left padding puts every row's first new token in the same column; HF derives position
    ids from the attention mask, so the padding changes neither positions nor attention.
    The template already holds any BOS, hence ``add_special_tokens=False``.
    """
    assert tokenizer.padding_side == "left", "right padding would put pads inside the answers"
    enc = tokenizer(list(prompts), add_special_tokens=False, padding=True, return_tensors="pt")
    enc = enc.to(model.device)
    out = model.generate(**enc, generation_config=config)
    rows = out[:, enc["input_ids"].shape[1]:].tolist()
    return [cut_at_stop(tokenizer, row, stops) for row in rows]


def cut_at_stop(tokenizer, row: Sequence[int], stops: Sequence[int]) -> TurnResult:
    """The answer up to its first stop token; what follows it in the row is padding."""
    stop_at = next((j for j, token in enumerate(row) if token in stops), None)
    ids = list(row if stop_at is None else row[:stop_at])
    # Special tokens are kept in the text so that re-tokenizing gives them back.
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return TurnResult(text=text, num_tokens=len(ids), finished=stop_at is not None)


def assistant_positions(messages: Sequence[Message]) -> list[int]:
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


def with_answer_slots(messages: Sequence[Message]) -> tuple[list[Message], list[int]]:
    """A copy of ``messages`` with a slot for each assistant turn to generate, and the slots.

    A conversation ending with a user or tool turn waits for the assistant's answer: an empty
    assistant turn is appended for it, so prompts-only lines get their answer.
    """
    conv = [dict(m) for m in messages]
    if conv and conv[-1]["role"] in ("user", "tool"):
        conv.append({"role": "assistant", "content": ""})
    return conv, assistant_positions(conv)


def store_turn(tokenizer, conv: list[Message], pos: int, turn: TurnResult,
               stops: Sequence[int], enable_thinking: bool) -> TurnResult:
    """Write ``turn`` into its slot and check that it re-renders as what was generated."""
    conv[pos] = {"role": "assistant", "content": turn.text}
    ok = turn.finished and round_trips(tokenizer, conv, pos, turn.text, stops, enable_thinking)
    return dataclasses.replace(turn, round_trips=ok)


def regenerate_batch(model, tokenizer, requests: Sequence[GenRequest],
                     config: GenerationConfig, stops: Sequence[int],
                     enable_thinking: bool = True,
                     decode: Optional[Callable[[list[str]], list[TurnResult]]] = None,
                     ) -> list[tuple[list[Message], list[TurnResult]]]:
    """Each request's conversation with its assistant turns regenerated, round by round.

    ``decode`` answers one round's rendered prompts (default: one left-padded ``generate``
    call, :func:`greedy_batch`; the static engine passes :func:`static_round`)."""
    if decode is None:
        def decode(prompts: list[str]) -> list[TurnResult]:
            return greedy_batch(model, tokenizer, prompts, config, stops)
    convs, positions = zip(*(with_answer_slots(r.messages) for r in requests)) \
        if requests else ((), ())
    convs = list(convs)
    turns: list[list[TurnResult]] = [[] for _ in requests]
    for depth in range(max((len(p) for p in positions), default=0)):
        todo = [(i, p[depth]) for i, p in enumerate(positions) if depth < len(p)]
        prompts = [render_prompt(tokenizer, convs[i][:pos], enable_thinking) for i, pos in todo]
        for (i, pos), turn in zip(todo, decode(prompts)):
            turns[i].append(store_turn(tokenizer, convs[i], pos, turn, stops, enable_thinking))
    return list(zip(convs, turns))


def ensure_pad_token(tokenizer) -> int:
    """The pad id for batching; tokenizers without one (Llama) pad with their eos, which is
    harmless: everything from a row's first stop token on is cut off anyway."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("the target's tokenizer has neither a pad nor an eos token: "
                             "cannot left-pad a batch or tell where a turn ends")
        tokenizer.pad_token = tokenizer.eos_token
    return int(tokenizer.pad_token_id)


def static_round(engine, tokenizer, prompts: Sequence[str], config: GenerationConfig,
                 stops: Sequence[int]) -> list[TurnResult]:
    """Greedy answers to rendered prompts on the static-cache engine
    (:class:`pipeline.regen.static_engine.StaticEngine`, kept by the worker from call to
    call): no padding, finished rows refilled."""
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    answers = engine.decode(ids, config.max_new_tokens, set(stops))
    return [cut_at_stop(tokenizer, row, stops) for row in answers]
