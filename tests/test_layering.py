"""The package's layers, lowest first: a module imports only from its own layer or below.

    base         checks/ (config values and keys, pre-checks, dtype names), runtime/ (Ray
                 start-up, kept actors, stop signals, start-up GC, wandb's environment, the
                 disk-full and error-chain lines), dist/, serving/
    libraries    model/, objective/, data/, transport/, assets/ (each with its own config.py)
    components   training/, eval/, checkpoint/: the drafter trainer, optimizer, plan, tau,
                 checkpoints; each gets only its own config section, never the job's JobConfig
    job          job/: one job put together: config.py (JobConfig), resolve.py, job_data.py,
                 assembly.py; resume_contract.py (a resume's settings, read from the
                 JobConfig); gpu_oom.py (an out-of-memory error's line, naming its settings);
                 cli_help.py (the entry points' help pages); config_reference.py (the key
                 reference in docs/CONFIG.md, rendered from the config dataclasses)
    workers      workers/: the Ray actors' plain classes; they run without the driver
    regen        regen/: the regeneration tool (its generator actor uses the workers' helpers)
    driver       driver/: the training job over Ray
    reference    reference/, the single-process reference trainer: the driver's peer, placed
                 above it so that the driver cannot import it
    entry points train.py, train_single.py, export.py, regenerate.py

A layer is made of whole packages and top-level modules: a package sits in one layer, all of
it, so a module that needs a higher layer than its package's lives outside that package (a
package split across layers would have the config that imports it import back up through it).
A new module must be placed here (the test fails until it is), and an import of a higher
layer, lazy ones inside functions included, fails the test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pipeline

PACKAGE = Path(pipeline.__file__).resolve().parent

LAYERS: list[tuple[str, set[str]]] = [
    ("base", {"__init__.py", "checks", "runtime", "dist", "serving"}),
    ("libraries", {"model", "objective", "data", "transport", "assets"}),
    ("components", {"training", "eval", "checkpoint"}),
    ("job", {"job"}),
    ("workers", {"workers"}),
    ("regen", {"regen"}),
    ("driver", {"driver"}),
    ("reference", {"reference"}),
    ("entry points", {"train.py", "train_single.py", "export.py", "regenerate.py"}),
]


def layer_of(rel: str) -> int:
    """The layer of a module by its path under pipeline/: its package's, or its own when it is
    a top-level module."""
    first = rel.split("/")[0]
    for i, (_, members) in enumerate(LAYERS):
        if first in members:
            return i
    raise KeyError(f"pipeline/{rel} is in no layer: place it in tests/test_layering.py LAYERS")


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _module_file(name: str) -> str | None:
    """``pipeline.a.b.c`` -> the file under pipeline/ it loads (``a/b.py`` when c is a name)."""
    parts = name.split(".")
    if parts[0] != "pipeline":
        return None
    for end in range(len(parts), 1, -1):
        path = "/".join(parts[1:end])
        if (PACKAGE / f"{path}.py").is_file():
            return f"{path}.py"
        if (PACKAGE / path / "__init__.py").is_file():
            return f"{path}/__init__.py"
    return "__init__.py"  # `import pipeline` itself


def upward_imports(rel: str, source: str) -> list[str]:
    """Each import in ``source`` (the module pipeline/``rel``) of a higher layer, as one line."""
    own = layer_of(rel)
    bad = []
    for line, name in _imported_modules(ast.parse(source)):
        target = _module_file(name)
        if target is not None and layer_of(target) > own:
            bad.append(f"pipeline/{rel}:{line} ({LAYERS[own][0]}) imports {name} "
                       f"({LAYERS[layer_of(target)][0]})")
    return bad


def _modules() -> list[str]:
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


def test_a_layer_holds_whole_packages():
    """No entry names a module inside a package: that would let the package span layers."""
    inside = [m for _, members in LAYERS for m in members if "/" in m]
    assert not inside, f"LAYERS places modules apart from their package: {inside}"


def test_every_module_has_a_layer():
    modules = _modules()
    assert len(modules) > 50 and "workers/drafter_worker.py" in modules
    for rel in modules:
        layer_of(rel)  # raises for a module no layer names
    with pytest.raises(KeyError, match="pipeline/newpkg/x.py is in no layer"):
        layer_of("newpkg/x.py")


def test_no_module_imports_a_higher_layer():
    bad = [line for rel in _modules() for line in upward_imports(rel, (PACKAGE / rel).read_text())]
    assert not bad, "imports run up the layers:\n" + "\n".join(bad)


def test_no_two_packages_import_each_other():
    """Within a layer imports may cross packages, but never both ways (an import cycle)."""
    edges = set()
    for rel in _modules():
        for _, name in _imported_modules(ast.parse((PACKAGE / rel).read_text())):
            target = _module_file(name)
            src, dst = rel.split("/")[0], target and target.split("/")[0]
            if dst and src != dst and "/" in rel and "/" in target:
                edges.add((src, dst))
    cycles = sorted(f"{a} <-> {b}" for a, b in edges if (b, a) in edges and a < b)
    assert not cycles, "packages import each other: " + ", ".join(cycles)


def test_the_check_sees_an_upward_import():
    source = ("from pipeline.driver.job import Driver\nfrom pipeline import driver\n"
              "from pipeline.data import Batch\n"
              "def f():\n    import pipeline.reference.trainer\n")
    assert [name for _, name in _imported_modules(ast.parse(source))] == [
        "pipeline.driver.job.Driver", "pipeline.driver", "pipeline.data.Batch",
        "pipeline.reference.trainer"]
    bad = upward_imports("workers/prefetcher.py", source)
    assert [b.split(" imports ")[1] for b in bad] == [
        "pipeline.driver.job.Driver (driver)", "pipeline.driver (driver)",
        "pipeline.reference.trainer (reference)"]
    # The reference trainer and the components it uses sit in different layers.
    assert upward_imports("training/plan.py", source)[-1].endswith(
        "imports pipeline.reference.trainer (reference)")
    assert upward_imports("driver/actors.py", source) == [
        "pipeline/driver/actors.py:5 (driver) imports pipeline.reference.trainer (reference)"]
    assert not upward_imports("train.py", source)


# Imported by none of the workers' modules: each Ray actor is a fresh Python process that
# imports its class's module, and these cost most of a CPU-second each (DCP and DTensor bring
# sympy). The drafter imports DCP where it saves or loads a checkpoint, FSDP under
# drafter.parallel=fsdp; the target's transformers model brings its own.
_HEAVY = ("torch.distributed.checkpoint", "torch.distributed.tensor", "torch.distributed.fsdp",
          "torch._dynamo", "sympy", "transformers")


def test_importing_a_worker_module_imports_no_checkpoint_or_compiler_stack():
    import subprocess
    import sys

    modules = ["pipeline.workers." + m for m in ("drafter_worker", "target_worker",
                                                 "prefetcher", "eval_worker", "stage_worker")]
    code = (f"import sys, {', '.join(modules)}\n"
            f"print(','.join(m for m in {_HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=PACKAGE.parent, check=True).stdout.strip()
    assert out == "", f"importing the worker modules imported {out}"


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module in ``graph`` (module -> the
    modules it imports), sorted: modules that import each other, directly or around a loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def test_no_module_import_cycle():
    """No two modules import each other, around any loop, lazy and type-checking imports
    included: a cycle ties the modules' import order to whichever is imported first."""
    graph = {}
    for rel in _modules():
        targets = {_module_file(name) for _, name in
                   _imported_modules(ast.parse((PACKAGE / rel).read_text()))}
        graph[rel] = {t for t in targets if t and t != rel and not t.endswith("__init__.py")}
    cycles = import_cycles(graph)
    assert not cycles, "modules import each other: " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_the_cycle_check_sees_a_loop():
    graph = {"a.py": {"b.py"}, "b.py": {"c.py"}, "c.py": {"a.py"}, "d.py": {"a.py"}}
    assert import_cycles(graph) == [["a.py", "b.py", "c.py"]]
    assert import_cycles({"a.py": {"b.py"}, "b.py": set()}) == []
