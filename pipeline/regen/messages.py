"""What crosses the driver/generator boundary: one request and one result per conversation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# One chat turn in OpenAI form: {"role": ..., "content": str, + optional keys}.
Message = dict[str, Any]


@dataclass(frozen=True)
class GenRequest:
    line_index: int  # 0-based line of the input file: the conversation's id
    messages: tuple[Message, ...]  # the input conversation; its assistant turns get replaced


@dataclass(frozen=True)
class TurnResult:
    """One regenerated assistant turn."""

    text: str  # decoded answer, without the token that ended it
    num_tokens: int  # generated tokens, without the stop token
    finished: bool  # True: the target ended its turn; False: max_new_tokens cut it
    # The stored turn re-renders through the chat template as exactly what was generated
    # (always False for a cut turn: the template closes it with a stop token it never wrote).
    round_trips: bool = True


@dataclass(frozen=True)
class GenResult:
    line_index: int
    messages: tuple[Message, ...]  # the conversation with every assistant turn regenerated
    turns: tuple[TurnResult, ...]  # one per assistant turn, in conversation order
    on_main_thread: bool  # the worker ran it on its main thread (plain actor, as intended)
