"""The keyword a transformers model's ``forward`` takes its KV cache by.

transformers 5.2x renamed ``past_key_values`` to ``cache``; the old name is still accepted
there, with a FutureWarning a user cannot act on. The GPU machine's 5.17 knows only the old
one. Every caller that passes a cache asks here.
"""

from __future__ import annotations

import inspect


def cache_keyword(model) -> str:
    """``"cache"`` where ``model.forward`` takes it, else ``"past_key_values"``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
