"""Chat conversation -> (input_ids, loss_mask) through the tokenizer's own chat template.

Only what the assistant says is supervised: each assistant message's content plus the
end-of-turn text the template writes right after it (e.g. ``<|im_end|>``), so the drafter also
learns to end a turn. Role headers (``<|im_start|>assistant\\n``), system and user turns are
not. Nothing here knows a particular template: the conversation is rendered once, each message
content is located in the rendered text (searching forward, in order), and the character spans
of the assistant turns are mapped to tokens through a fast tokenizer's offsets.
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

log = logging.getLogger(__name__)

# Stands in for an assistant message when probing what a template writes after the content.
_PROBE = "DFLASHPROBE7f3a9c"

Span = tuple[int, int]  # [start, end) character offsets in the rendered text


def end_of_turn_text(tokenizer) -> str:
    """What the chat template writes right after an assistant message's content.

    Trailing whitespace is left out: the target stops at the end-of-turn token, so the newline
    a template puts between turns is never generated and is not worth supervising.
    """
    probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}]
    text = tokenizer.apply_chat_template(probe, tokenize=False)
    at = text.rfind(_PROBE)
    if at < 0:
        raise ValueError("the tokenizer's chat template does not render assistant content "
                         "verbatim; cannot locate assistant turns to supervise")
    return text[at + len(_PROBE):].rstrip()


def render_conversation(tokenizer, messages: Sequence[dict[str, str]],
                        end_of_turn: str) -> tuple[str, list[Span]]:
    """The template's text for ``messages`` and the character spans to supervise.

    Every message's content is searched from a cursor that only moves forward, so a user turn
    that repeats an earlier answer cannot be mistaken for it. Before an assistant turn the
    cursor jumps to the end of its role header where the template allows (see
    :func:`_header_end`), so a short answer such as "im" cannot match inside ``<|im_end|>``.
    Templates may strip surrounding whitespace, so a content that is not found verbatim is
    looked up stripped; an assistant content found neither way is an error (the line cannot be
    supervised correctly).
    """
    text = tokenizer.apply_chat_template(list(messages), tokenize=False)
    cursor, spans = 0, []
    for i, message in enumerate(messages):
        if message["role"] == "assistant" and i > 0:
            cursor = max(cursor, _header_end(tokenizer, messages[:i], text))
        span = _find(text, message["content"], cursor)
        if span is None:
            if message["role"] == "assistant":
                raise ValueError(f"assistant turn {i}: its content is not in the text the chat "
                                 f"template renders")
            continue  # e.g. a system prompt the template rewrites: not needed for the cursor
        start, end = span
        if message["role"] == "assistant":
            if end_of_turn and text.startswith(end_of_turn, end):
                end += len(end_of_turn)
            spans.append((start, end))
        cursor = end
    return text, spans


def _header_end(tokenizer, history: Sequence[dict[str, str]], text: str) -> int:
    """Where the next assistant content starts: the end of the history's generation prompt.

    Returns 0 (no information) for templates whose generation prompt is not a prefix of the
    rendered conversation (some add reasoning markers only to finished turns).
    """
    prompt = tokenizer.apply_chat_template(list(history), tokenize=False,
                                           add_generation_prompt=True)
    return len(prompt) if text.startswith(prompt) else 0


def _find(text: str, content: str, cursor: int) -> Optional[Span]:
    for candidate in (content, content.strip()):
        at = text.find(candidate, cursor)
        if at >= 0:
            return at, at + len(candidate)
    return None


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


def tokenize_rendered(tokenizer, texts: Sequence[str],
                      spans: Sequence[Sequence[Span]]) -> list[tuple[list[int], list[int]]]:
    """Tokenize rendered conversations (one batched call) and build their loss masks."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{type(tokenizer).__name__} is not a fast tokenizer; loss masks need "
                         f"return_offsets_mapping (load it with use_fast=True)")
    # The template already wrote any BOS/EOS it wants; the tokenizer must not add more.
    enc = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True)
    return [(list(ids), mask_from_spans(offsets, s))
            for ids, offsets, s in zip(enc["input_ids"], enc["offset_mapping"], spans)]


def encode_conversation(tokenizer, messages: Sequence[dict[str, str]], max_length: int,
                        end_of_turn: Optional[str] = None) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) of one conversation, truncated to ``max_length`` tokens.

    ``end_of_turn`` defaults to :func:`end_of_turn_text`; pass it in when encoding many
    conversations with one tokenizer to probe the template once.
    """
    if end_of_turn is None:
        end_of_turn = end_of_turn_text(tokenizer)
    text, spans = render_conversation(tokenizer, messages, end_of_turn)
    [(ids, mask)] = tokenize_rendered(tokenizer, [text], [spans])
    return ids[:max_length], mask[:max_length]
