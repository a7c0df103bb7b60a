"""The one way this project applies a chat template, so every caller passes the same options.

Regeneration (the target writing its answers), training (encoding those answers) and eval
(held-out prompts) must render a conversation identically, or the drafter learns to follow
prompts the target never saw. ``enable_thinking`` is the only template option we set: Qwen3's
template reads it (``false`` writes an empty ``<think>`` block into the generation prompt, so
the target answers without reasoning); templates that do not know it ignore it.
"""

from __future__ import annotations

from typing import Any, Sequence

Message = dict[str, Any]


def render(tokenizer, messages: Sequence[Message], *, add_generation_prompt: bool,
           enable_thinking: bool) -> str:
    """The template's text for ``messages``; with ``add_generation_prompt``, ending where the
    target starts writing its next assistant turn."""
    return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                         add_generation_prompt=add_generation_prompt,
                                         enable_thinking=enable_thinking)


def prompt_ids(tokenizer, messages: Sequence[Message], *, enable_thinking: bool) -> list[int]:
    """Token ids of the generation prompt after ``messages`` (the template holds any BOS)."""
    text = render(tokenizer, messages, add_generation_prompt=True,
                  enable_thinking=enable_thinking)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
