"""The corpus: CPython's standard library (.py sources) and pydoc's help topics, on every machine.

Files are split into train and held-out by a stable hash of their path relative to the
standard library root, so the split does not depend on the machine, the file order or the
Python build. Files that are not UTF-8 are counted and left out.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass, field

# Third-party code and caches are not the standard library.
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
TOPICS_PATH = "pydoc_data/topics.txt"  # the help topics, one document, under this name


@dataclass
class Corpus:
    root: str
    train: list[tuple[str, str]] = field(default_factory=list)  # (relative path, text)
    heldout: list[tuple[str, str]] = field(default_factory=list)
    not_utf8: int = 0

    def stats(self) -> dict:
        return {"root": self.root, "train_files": len(self.train),
                "heldout_files": len(self.heldout), "not_utf8_files": self.not_utf8,
                "train_chars": sum(len(t) for _, t in self.train),
                "heldout_chars": sum(len(t) for _, t in self.heldout)}


def is_heldout(rel_path: str, fraction: float) -> bool:
    """Held out when the path's SHA-256, read as a number in [0, 1), is below ``fraction``."""
    digest = hashlib.sha256(rel_path.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def _python_files(root: str) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        out.extend(os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py"))
    return out


def _topics_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(f"{name}\n{text}" for name, text in sorted(topics.items()))


def load_corpus(heldout_fraction: float, max_chars: int = 0) -> Corpus:
    """Every .py file of the standard library plus the help topics, split by path hash.

    ``max_chars`` > 0 keeps only the files (in sorted path order) that fit, for small runs.
    """
    root = stdlib_root()
    corpus = Corpus(root=root)
    docs = [(TOPICS_PATH, _topics_text())]
    for path in _python_files(root):
        try:
            with open(path, encoding="utf-8") as f:
                docs.append((os.path.relpath(path, root), f.read()))
        except (UnicodeDecodeError, ValueError):
            corpus.not_utf8 += 1
    total = 0
    for rel, text in docs:
        if max_chars and total + len(text) > max_chars:
            continue
        total += len(text)
        (corpus.heldout if is_heldout(rel, heldout_fraction) else corpus.train).append(
            (rel, text))
    if not corpus.train or not corpus.heldout:
        raise ValueError(f"corpus split of {root} is empty on one side: {corpus.stats()}")
    return corpus
