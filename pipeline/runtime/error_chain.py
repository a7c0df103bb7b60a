"""Every exception behind a job's error, for the one-line headlines (a full disk, a GPU out of
memory): Python's ``__cause__`` and ``__context__``, and the actor's own exception that Ray's
``RayTaskError`` keeps as ``cause``."""

from __future__ import annotations

from typing import Iterator


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` first, then the exceptions behind it, breadth first, each once."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        # A RayTaskError made an instance of its cause's class forwards unknown attributes to
        # the cause, so this finds the cause either way.
        todo += [vars(e).get("cause"), e.__cause__, e.__context__]
