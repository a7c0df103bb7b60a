"""Config validation helpers: every error names the key, the value and what is allowed."""

from __future__ import annotations

from typing import Any, Sequence


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{key}={value!r} is not allowed: expected {allowed}")


def require_choice(key: str, value: Any, choices: Sequence[Any]) -> None:
    # Closed choices are plain str fields checked here: OmegaConf cannot type-check Literal.
    require(value in choices, key, value, f"one of {list(choices)}")
