"""The corpus: every Python source on the machine (the standard library and every installed
package on ``sys.path``) and pydoc's help topics.

A target trained on the standard library alone (2.6M tokens on the H200's slim Python) saw
each file 17 times in its two minutes and memorised it: held-out loss 3.8 nats/token against
0.12 on its training files, so drafters learned a recall they were never scored on. Installed
packages (torch, transformers, ray, ... on the GPU machine) make the corpus large enough to be
seen about once.

Documents are named by their path relative to their root (``json/decoder.py``,
``torch/nn/modules/linear.py``), so names do not depend on where Python is installed. Exact
copies (vendored files, the same package on two paths) are kept once, the first read, and
counted. Files are split into train and held-out by a stable hash of their name, so two
versions of one file land on the same side. Files that are not UTF-8 are counted and left out.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass, field

# Caches are not sources; the standard library's walk leaves the package folders to theirs.
_SKIP_DIRS = {"__pycache__"}
_PACKAGE_DIRS = {"site-packages", "dist-packages"}
TOPICS_PATH = "pydoc_data/topics.txt"  # the help topics, one document, under this name


@dataclass
class Corpus:
    roots: list[str]
    train: list[tuple[str, str]] = field(default_factory=list)  # (name, text)
    heldout: list[tuple[str, str]] = field(default_factory=list)
    not_utf8: int = 0
    duplicates: int = 0
    left_out_by_cap: int = 0

    def stats(self) -> dict:
        return {"roots": self.roots, "train_files": len(self.train),
                "heldout_files": len(self.heldout), "not_utf8_files": self.not_utf8,
                "duplicate_files": self.duplicates, "left_out_by_cap": self.left_out_by_cap,
                "train_chars": sum(len(t) for _, t in self.train),
                "heldout_chars": sum(len(t) for _, t in self.heldout)}


def _unit(name: str) -> float:
    """The name's SHA-256 read as a number in [0, 1)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2**64


def is_heldout(name: str, fraction: float) -> bool:
    """Held out when the name's hash is below ``fraction``."""
    return _unit(name) < fraction


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def package_roots(exclude: tuple[str, ...] = ()) -> list[str]:
    """Folders on ``sys.path`` other than the standard library and the folders in
    ``exclude``, each once; a site-packages folder is kept even inside those (a project's own
    virtual environment)."""
    stdlib = os.path.realpath(stdlib_root())
    skip = {os.path.realpath(p) for p in exclude}
    seen, out = set(), []
    for path in sys.path:  # what this interpreter can import, site-packages included
        real = os.path.realpath(path or os.curdir)
        package_dir = bool(set(real.split(os.sep)) & _PACKAGE_DIRS)
        excluded = any(real == top or real.startswith(top + os.sep) for top in skip)
        if (real in seen or real == stdlib or not os.path.isdir(real)
                or ((excluded or real.startswith(stdlib + os.sep)) and not package_dir)):
            continue
        seen.add(real)
        out.append(real)
    return out


def _python_files(root: str, skip_dirs: set[str]) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs)
        out.extend(os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py"))
    return out


def _topics_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(f"{name}\n{text}" for name, text in sorted(topics.items()))


def _sources(roots: list[str]) -> list[tuple[str, str]]:
    """(name, path) of every .py file under ``roots``, the first root the standard library."""
    out = []
    for i, root in enumerate(roots):
        skip = _SKIP_DIRS | (_PACKAGE_DIRS if i == 0 else set())
        out.extend((os.path.relpath(path, root), path) for path in _python_files(root, skip))
    return out


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, ValueError, OSError):
        return None


def load_corpus(heldout_fraction: float, max_chars: int = 0, packages: bool = True,
                exclude: tuple[str, ...] = ()) -> Corpus:
    """Every distinct .py file of the standard library (and, with ``packages``, of every
    package root but ``exclude``) plus the help topics, split by name hash.

    ``max_chars`` > 0 reads files in the order of their name's hash (a spread over every
    package, not the alphabet's first) until the next would not fit; the rest are counted.
    """
    roots = [stdlib_root()] + (package_roots(exclude) if packages else [])
    corpus = Corpus(roots=roots)
    sources = _sources(roots)
    if max_chars:
        sources.sort(key=lambda source: _unit("order:" + source[0]))
    topics = _topics_text()
    fits = not max_chars or len(topics) <= max_chars
    docs, digests, total = [(TOPICS_PATH, topics)] if fits else [], set(), len(topics) * fits
    for n, (name, path) in enumerate(sources):
        text = _read(path)
        if text is None:
            corpus.not_utf8 += 1
            continue
        digest = hashlib.sha256(text.encode()).digest()
        if digest in digests:
            corpus.duplicates += 1
            continue
        if max_chars and total + len(text) > max_chars:
            corpus.left_out_by_cap = len(sources) - n
            break
        digests.add(digest)
        total += len(text)
        docs.append((name, text))
    for name, text in docs:
        (corpus.heldout if is_heldout(name, heldout_fraction) else corpus.train).append(
            (name, text))
    if not corpus.train or not corpus.heldout:
        raise ValueError(f"corpus split of {roots} is empty on one side: {corpus.stats()}")
    return corpus
