"""The text the tiny assets are made from: Python's own help topics (``pydoc_data``).

They ship with CPython (about 80 topics, 0.5 MB), so the demo needs no download.
"""

from __future__ import annotations

import random
import re

# Underlines of section titles ("******", "======"): noise a tiny model would only copy.
_RULE = re.compile(r"^[*=~^-]+$")


def normalize_text(text: str) -> str:
    """One paragraph per line, runs of whitespace collapsed, title underlines removed.

    Help text is indented and hard-wrapped; a small model trained briefly on it mostly learns
    to emit newlines and spaces. Flowing paragraphs put its capacity into words instead.
    """
    text = "\n".join(line for line in text.splitlines() if not _RULE.match(line.strip()))
    paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", text))
    return "\n".join(p for p in paragraphs if p)


def pydoc_topics() -> list[tuple[str, str]]:
    """(name, normalized text) of every help topic, sorted by name so the order never varies."""
    from pydoc_data.topics import topics

    return [(name, normalize_text(text)) for name, text in sorted(topics.items())]


def target_corpus(topics: list[tuple[str, str]], max_chars: int, seed: int) -> str:
    """Help topics in a seeded random order, joined, cut to ``max_chars`` at a space.

    The target memorises this text: with a minute of CPU that is what makes its greedy
    answers varied text instead of a phrase repeated forever. ``random.Random(seed)``
    shuffles the same way on every platform and Python 3 version.
    """
    order = list(range(len(topics)))
    random.Random(seed).shuffle(order)
    text = "\n".join(topics[i][1] for i in order)
    if len(text) <= max_chars:
        return text
    cut = text.rfind(" ", 0, max_chars)
    return text[:cut if cut > 0 else max_chars]
