"""bench/real_model_prompts.py: prompts from documented APIs, deduplicated, split by module."""

import gzip
import json

from bench.quality.corpus import is_heldout
from bench.real_model_prompts import (STYLES, build_prompts, humaneval_prompts, module_name,
                                      render, style_of)

SOURCE = '''
def public(a, b=1, *, c=None) -> int:
    """Add a and b, then scale by c when it is given; return the integer result."""


def _private(x):
    """A private helper that the prompt builder must leave out of its prompts."""


def terse(x):
    """Too short."""


class Widget:
    """A widget that holds a value and can render it as text for display."""

    def __init__(self, value, label="w"):
        self.value = value

    def render(self, width=10):
        """Render the value padded to width characters, with the label in front."""
'''


def _docs(n_modules):
    """Modules of distinct APIs (identical text would be deduplicated across them)."""
    return [(f"pkg{i}/mod.py", SOURCE.replace("widget", f"widget {i}").replace(
        "Add a and b", f"Add a and b ({i})").replace("Render the", f"Render ({i}) the"))
        for i in range(n_modules)]


def test_public_documented_apis_become_one_prompt_each_in_a_stable_style():
    built = build_prompts([("pkg/mod.py", SOURCE), ("pkg/mod.py", SOURCE)], 0.0)
    names = sorted(p.api.qualname for p in built.train)
    assert names == ["Widget", "Widget.render", "public"]  # no _private, no terse docstring
    assert built.stats["duplicates"] == 3  # the second copy of the file: kept once
    widget = next(p for p in built.train if p.api.qualname == "Widget")
    assert widget.api.signature == "Widget(value, label='w')"
    for p in built.train:
        assert p.style == style_of(p.api) in STYLES
        assert json.loads(p.line()) == {"messages": [{"role": "user", "content": p.text}]}
    for style in STYLES:
        assert "pkg.mod.Widget" in render(widget.api, style) or "class Widget" in \
            render(widget.api, style)


def test_split_is_by_source_module_and_counts_add_up():
    built = build_prompts(_docs(40), 0.3)
    held = {p.api.module for p in built.heldout}
    trained = {p.api.module for p in built.train}
    assert held and trained and not held & trained
    assert all(is_heldout(m, 0.3) for m in held) and not any(is_heldout(m, 0.3) for m in trained)
    stats = built.stats
    assert stats["train"]["prompts"] + stats["heldout"]["prompts"] == stats["prompts"] == 120
    assert sum(stats["train"]["by_style"].values()) == stats["train"]["prompts"]


def test_cap_keeps_a_seeded_sample_and_says_how_many_were_left_out():
    a, b = build_prompts(_docs(10), 0.2, max_prompts=7), build_prompts(_docs(10), 0.2, 7)
    assert [p.text for p in a.train + a.heldout] == [p.text for p in b.train + b.heldout]
    assert a.stats["prompts"] == 7 and a.stats["left_out_by_cap"] == 23


def test_unparsable_file_and_test_suites_are_counted_not_prompted():
    built = build_prompts([("bad.py", "def (:\n"), ("pkg/mod.py", SOURCE),
                           ("pkg/tests/test_mod.py", SOURCE), ("idlelib/idle_test/x.py", SOURCE)],
                          0.0)
    assert built.stats["unparsable_files"] == 1 and built.stats["files"] == 1
    assert built.stats["test_files_left_out"] == 2
    assert {p.api.module for p in built.train} == {"pkg.mod"}


def test_module_names_and_humaneval(tmp_path):
    assert module_name("json/decoder.py") == "json.decoder"
    assert module_name("json/__init__.py") == "json"
    path = tmp_path / "he.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"prompt": "def f(x):\n    \"\"\"Return x.\"\"\"\n"}) + "\n")
    (text,) = humaneval_prompts(str(path))
    assert text.startswith("Complete this Python function") and "def f(x):" in text
