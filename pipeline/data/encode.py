"""Chat conversation -> training sequences with a loss mask, through the target's chat template.

The mask covers exactly what the target generated: for each assistant turn, the text its chat
template writes after that turn's own generation prompt, up to and including the end-of-turn
token (``<|im_end|>``, ``<|eot_id|>``, ...). Role headers, an empty ``<think>`` block that the
prompt already holds, system, user and tool turns are context. Nothing here knows a particular
template: every turn is rendered twice, as the prompt the target saw
(``messages[:i]`` plus the generation prompt) and as the finished turn (``messages[:i+1]``), and
the difference is what the target wrote.

Templates need not keep history as it was generated. Qwen3's drops the ``<think>`` reasoning of
every assistant turn before the last user message, so the prompt of turn 2 does not continue
the text in which turn 1 was generated. Then a conversation becomes several *segments*: each
is a token sequence the target really saw, and each assistant turn is supervised in exactly one
of them. Templates that only ever append (Llama 3, ChatML, Qwen3 with a single turn) give one
segment per conversation. Tokens after the last assistant turn are left out: the target is
causal, so they change nothing the drafter is trained on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

from pipeline.data.errors import BadLine
from pipeline.data.template import Message, render

log = logging.getLogger(__name__)

Span = tuple[int, int]  # [start, end) character offsets in a segment's text


@dataclass
class Segment:
    """One sequence the target saw, and the character spans of what it generated in it."""

    text: str
    spans: list[Span] = field(default_factory=list)


def _visible_answer(message: Message) -> str:
    """The answer part of an assistant message (reasoning may precede it in the content)."""
    content = message.get("content") or ""
    return content.split("</think>")[-1].strip()


def generated_text(tokenizer, messages: Sequence[Message], index: int,
                   enable_thinking: bool) -> tuple[str, str]:
    """(prompt, generated) for the assistant turn ``messages[index]``.

    ``generated`` is what the template writes for the turn after its generation prompt, with
    the whitespace a template puts between turns cut off: the target stops at its end-of-turn
    token and never writes that whitespace.
    """
    try:
        prompt = render(tokenizer, messages[:index], add_generation_prompt=True,
                        enable_thinking=enable_thinking)
        full = render(tokenizer, messages[:index + 1], add_generation_prompt=False,
                      enable_thinking=enable_thinking)
    except Exception as e:  # jinja errors (an unknown role, a turn the template refuses)
        raise BadLine("template", f"assistant turn {index}: the chat template fails on it "
                                  f"({type(e).__name__}: {e})") from None
    if not full.startswith(prompt):
        raise BadLine("template", f"assistant turn {index}: the chat template does not render "
                                  f"it after its own generation prompt, so what the target "
                                  f"wrote is unknown")
    generated = full[len(prompt):].rstrip()
    answer = _visible_answer(messages[index])
    if answer and answer not in generated:
        raise BadLine("template", f"assistant turn {index}: its content is not in the text "
                                  f"the chat template renders for it")
    return prompt, generated


def render_segments(tokenizer, messages: Sequence[Message],
                    enable_thinking: bool) -> list[Segment]:
    """The sequences to train on and the spans to supervise in each (see the module doc)."""
    segments: list[Segment] = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt, generated = generated_text(tokenizer, messages, index, enable_thinking)
        if not segments or not prompt.startswith(segments[-1].text):
            segments.append(Segment(prompt))  # the template rewrote history: a new sequence
        segment = segments[-1]
        segment.text = prompt + generated
        segment.spans.append((len(prompt), len(segment.text)))
    return segments


def mask_from_spans(offsets: Sequence[Span], spans: Sequence[Span]) -> list[int]:
    """1 for each token whose characters overlap a supervised span.

    A token that straddles a span's edge (a header character merged with the first content
    character) is supervised: the model has to produce it to produce the content.
    """
    mask, j = [0] * len(offsets), 0
    for i, (start, end) in enumerate(offsets):
        while j < len(spans) and spans[j][1] <= start:
            j += 1
        if j < len(spans) and start < end and start < spans[j][1] and end > spans[j][0]:
            mask[i] = 1
    return mask


def tokenize_segments(tokenizer, segments: Sequence[Segment]
                      ) -> list[tuple[list[int], list[int]]]:
    """Tokenize segments (one batched call) and build their loss masks."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{type(tokenizer).__name__} is not a fast tokenizer; loss masks need "
                         f"return_offsets_mapping (load it with use_fast=True)")
    if not segments:
        return []
    # The template already wrote any BOS/EOS it wants; the tokenizer must not add more.
    enc = tokenizer([s.text for s in segments], add_special_tokens=False,
                    return_offsets_mapping=True)
    return [(list(ids), mask_from_spans(offsets, s.spans))
            for ids, offsets, s in zip(enc["input_ids"], enc["offset_mapping"], segments)]


def encode_conversation(tokenizer, messages: Sequence[Message], max_length: int,
                        enable_thinking: bool = True,
                        ) -> list[tuple[list[int], list[int]]]:
    """(input_ids, loss_mask) of each segment of one conversation, cut to ``max_length``."""
    encoded = tokenize_segments(tokenizer, render_segments(tokenizer, messages,
                                                           enable_thinking))
    return [(ids[:max_length], mask[:max_length]) for ids, mask in encoded]

