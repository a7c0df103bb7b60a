"""Real prompts at scale, made offline: requests about every documented Python API on the machine.

    python -m bench.real_model_prompts --out /tmp/prompts                 # every package
    python -m bench.real_model_prompts --out /tmp/prompts --max-prompts 2000 --no-packages
    python -m bench.real_model_prompts --out /tmp/prompts --humaneval HumanEval.jsonl.gz

Every public function and class with a docstring in the standard library and every installed
package (test suites left out) (the sources bench/quality/corpus.py walks; exact copies of a file once) becomes one
user request in one of several task styles, picked by a stable hash of the API's name:

* ``implement``: write the function (or class) given its signature and docstring;
* ``explain``: explain what it does, its parameters and its result;
* ``usage``: how do I use it, with a short example;
* ``tests``: write pytest tests for it, given its signature and docstring.

Lines are prompts only, ``{"messages": [{"role": "user", "content": ...}]}``: the input of
``python -m pipeline.regenerate``, which writes the target's own answers. Identical prompts
(the same API vendored twice) are kept once and counted. The split is by a stable hash of the
SOURCE MODULE's name (``json.decoder``), so no prompt about a held-out module is trained on.
Files written to ``--out``:

* ``train.jsonl``: prompts about training modules;
* ``heldout.jsonl``: prompts about held-out modules, every style;
* ``heldout_explain.jsonl``: the held-out modules' ``explain`` prompts (a held-out set of
  another kind than HumanEval: prose about unseen APIs, not code completion);
* ``humaneval.jsonl`` (with ``--humaneval``): HumanEval's 164 prompts as chat requests;
* ``prompts_stats.json``: counts by style, by source (stdlib or the package's top name), and
  what was left out (parse errors, duplicates, the cap).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import logging
import os
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

from bench.quality.corpus import is_heldout, load_corpus

log = logging.getLogger(__name__)

STYLES = ("implement", "explain", "usage", "tests")
MIN_DOC_CHARS = 40  # shorter docstrings ("Return x.") say too little to ask about
MAX_DOC_CHARS = 1200  # about 300 tokens: prompt and answer fit data.max_length 768
_REPO = str(Path(__file__).resolve().parents[1])


@dataclass(frozen=True)
class Api:
    module: str  # dotted module name, e.g. json.decoder
    qualname: str  # Class, function or Class.method
    kind: str  # "function" or "class"
    signature: str  # "name(a, b=1)" (classes: their __init__'s, without self)
    doc: str


@dataclass(frozen=True)
class Prompt:
    api: Api
    style: str
    text: str

    def line(self) -> str:
        return json.dumps({"messages": [{"role": "user", "content": self.text}]},
                          ensure_ascii=False)


def module_name(path: str) -> str:
    """``json/decoder.py`` -> ``json.decoder``; ``pkg/__init__.py`` -> ``pkg``."""
    parts = path[:-3].split(os.sep) if path.endswith(".py") else path.split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def is_test_module(module: str) -> bool:
    """Test suites (``test.test_json``, ``idlelib.idle_test.x``, ``pkg.tests.y``): their
    documented classes are test cases, not APIs anyone asks about."""
    return any(part in ("test", "tests", "testing") or part.startswith("test_")
               or part.endswith("_test") for part in module.split("."))


def source_of(module: str) -> str:
    """What the stats group a module under: its top-level package name."""
    return module.split(".")[0]


def _signature(node, drop_self: bool) -> str:
    args = node.args
    if drop_self and args.args and args.args[0].arg in ("self", "cls"):
        args = ast.arguments(posonlyargs=args.posonlyargs, args=args.args[1:],
                             vararg=args.vararg, kwonlyargs=args.kwonlyargs,
                             kw_defaults=args.kw_defaults, kwarg=args.kwarg,
                             defaults=args.defaults[-len(args.args[1:]):]
                             if args.defaults and args.args[1:] else [])
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return f"{node.name}({ast.unparse(args)}){returns}"


def _doc(node) -> Optional[str]:
    doc = ast.get_docstring(node)
    if not doc or len(doc) < MIN_DOC_CHARS:
        return None
    if len(doc) > MAX_DOC_CHARS:  # cut at a paragraph, else at a line
        cut = doc.rfind("\n\n", 0, MAX_DOC_CHARS)
        cut = cut if cut > MIN_DOC_CHARS else doc.rfind("\n", 0, MAX_DOC_CHARS)
        doc = doc[:cut if cut > MIN_DOC_CHARS else MAX_DOC_CHARS].rstrip()
    return doc


def apis_of(module: str, source: str) -> list[Api]:
    """Public documented functions, classes and methods of public classes in ``source``."""
    tree = ast.parse(source)
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = _doc(node)
            if doc and not node.name.startswith("_"):
                out.append(Api(module, node.name, "function", _signature(node, False), doc))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            out += _class_apis(module, node)
    return out


def _class_apis(module: str, node: ast.ClassDef) -> list[Api]:
    out = []
    init = next((n for n in node.body if isinstance(n, ast.FunctionDef)
                 and n.name == "__init__"), None)
    doc = _doc(node)
    if doc:
        sig = (_signature(init, True).replace("__init__", node.name, 1) if init
               else f"{node.name}()")
        out.append(Api(module, node.name, "class", sig, doc))
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                not item.name.startswith("_"):
            doc = _doc(item)
            if doc:
                out.append(Api(module, f"{node.name}.{item.name}", "function",
                               _signature(item, True), doc))
    return out


def _unit(text: str) -> float:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def style_of(api: Api) -> str:
    return STYLES[int(_unit("style:" + api.module + ":" + api.qualname) * len(STYLES))]


def render(api: Api, style: str) -> str:
    """The user's request about ``api`` in ``style``."""
    name = f"{api.module}.{api.qualname}"
    what = "class" if api.kind == "class" else "function"
    stub = f'{"class" if api.kind == "class" else "def"} {api.signature}:\n    """{api.doc}"""'
    if style == "implement":
        return (f"Write a Python {what} with this signature and docstring. Give the complete "
                f"code.\n\n```python\n{stub}\n```")
    if style == "explain":
        return (f"Explain what the Python {what} `{name}` does: its parameters, what it returns "
                f"and when to use it.\n\nSignature: `{api.signature}`")
    if style == "usage":
        return (f"How do I use `{name}` in Python? Show a short example.\n\nIts documentation:"
                f"\n{api.doc}")
    if style == "tests":
        return f"Write pytest unit tests for this {what}.\n\n```python\n{stub}\n```"
    raise ValueError(f"style={style!r}: allowed {list(STYLES)}")


@dataclass
class PromptSet:
    train: list[Prompt]
    heldout: list[Prompt]
    stats: dict


def build_prompts(documents: Iterable[tuple[str, str]], heldout_fraction: float,
                  max_prompts: int = 0, seed: int = 0) -> PromptSet:
    """Prompts from ``documents`` ((relative path, source) pairs), deduplicated and split by
    the module's hash; ``max_prompts`` > 0 keeps a seeded sample of that many."""
    seen: set[str] = set()
    prompts: list[Prompt] = []
    counts = Counter()
    for path, source in documents:
        if not path.endswith(".py"):
            continue
        module = module_name(path)
        if is_test_module(module):
            counts["test_files_left_out"] += 1
            continue
        try:
            apis = apis_of(module, source)
        except (SyntaxError, ValueError, RecursionError):
            counts["unparsable_files"] += 1
            continue
        counts["files"] += 1
        for api in apis:
            style = style_of(api)
            text = render(api, style)
            if text in seen:
                counts["duplicates"] += 1
                continue
            seen.add(text)
            prompts.append(Prompt(api, style, text))
    if max_prompts and len(prompts) > max_prompts:
        counts["left_out_by_cap"] = len(prompts) - max_prompts
        prompts = random.Random(seed).sample(prompts, max_prompts)
        prompts.sort(key=lambda p: (p.api.module, p.api.qualname))
    train = [p for p in prompts if not is_heldout(p.api.module, heldout_fraction)]
    heldout = [p for p in prompts if is_heldout(p.api.module, heldout_fraction)]
    stats = {"prompts": len(prompts), "train": _counts(train), "heldout": _counts(heldout),
             "heldout_fraction": heldout_fraction, **counts}
    return PromptSet(train, heldout, stats)


def _counts(prompts: list[Prompt]) -> dict:
    sources = Counter(source_of(p.api.module) for p in prompts)
    return {"prompts": len(prompts), "modules": len({p.api.module for p in prompts}),
            "by_style": dict(sorted(Counter(p.style for p in prompts).items())),
            "by_kind": dict(sorted(Counter(p.api.kind for p in prompts).items())),
            "sources": len(sources), "top_sources": dict(sources.most_common(15))}


def humaneval_prompts(path: str) -> Iterator[str]:
    """HumanEval's prompts (a signature and docstring each) as chat requests."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            if line.strip():
                task = json.loads(line)
                yield ("Complete this Python function. Give the complete code.\n\n```python\n"
                       f"{task['prompt'].strip()}\n```")


def write_lines(path: Path, texts: Iterable[str]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w") as f:
        for text in texts:
            f.write(text + "\n")
            n += 1
    return n


def chat_line(text: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": text}]}, ensure_ascii=False)


def write_prompt_files(out: Path, heldout_fraction: float = 0.05, max_prompts: int = 0,
                       packages: bool = True, humaneval: Optional[str] = None,
                       seed: int = 0, max_corpus_chars: int = 0) -> dict:
    """Walk the machine's sources and write the files listed in the module doc; the stats.
    ``max_corpus_chars`` > 0 reads only a hash-ordered spread of files up to that size."""
    corpus = load_corpus(heldout_fraction, max_corpus_chars, packages=packages,
                         exclude=(_REPO,))
    prompts = build_prompts(corpus.train + corpus.heldout, heldout_fraction, max_prompts, seed)
    stats = dict(prompts.stats, corpus_files=len(corpus.train) + len(corpus.heldout),
                 corpus_duplicate_files=corpus.duplicates, corpus_not_utf8=corpus.not_utf8,
                 roots=corpus.roots)
    write_lines(out / "train.jsonl", (p.line() for p in prompts.train))
    write_lines(out / "heldout.jsonl", (p.line() for p in prompts.heldout))
    stats["heldout_explain"] = write_lines(
        out / "heldout_explain.jsonl", (p.line() for p in prompts.heldout if p.style == "explain"))
    if humaneval:
        stats["humaneval"] = write_lines(out / "humaneval.jsonl",
                                         map(chat_line, humaneval_prompts(humaneval)))
    (out / "prompts_stats.json").write_text(json.dumps(stats, indent=2))
    log.info("prompts: %d train, %d held-out (%d explain), by style %s", len(prompts.train),
             len(prompts.heldout), stats["heldout_explain"], stats["train"]["by_style"])
    return stats


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.real_model_prompts",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the JSONL files and stats")
    p.add_argument("--heldout-fraction", type=float, default=0.05,
                   help="share of source modules held out (by a hash of the module's name)")
    p.add_argument("--max-prompts", type=int, default=0, help="keep a seeded sample (0: all)")
    p.add_argument("--no-packages", action="store_true", help="the standard library only")
    p.add_argument("--humaneval", help="HumanEval.jsonl(.gz): also write humaneval.jsonl")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stats = write_prompt_files(Path(args.out), args.heldout_fraction, args.max_prompts,
                               not args.no_packages, args.humaneval, args.seed)
    print(json.dumps({k: stats[k] for k in ("prompts", "train", "heldout",
                                             "heldout_explain")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
