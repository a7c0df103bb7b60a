"""The driver package sits on top: nothing below it imports it.

Workers, the reference trainer, regeneration and the libraries they use must run without the
driver, so an import of ``pipeline.driver`` from any of them is a layering mistake. Only the
entry points (``python -m pipeline.train``, ``pipeline.export``) stand above the driver.
"""

import ast
from pathlib import Path

import pipeline

PACKAGE = Path(pipeline.__file__).resolve().parent
ENTRY_POINTS = {"train.py", "export.py"}


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _lower_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if "driver" not in p.relative_to(PACKAGE).parts[:1]
                  and p.relative_to(PACKAGE).as_posix() not in ENTRY_POINTS)


def test_nothing_below_the_driver_imports_it():
    modules = _lower_modules()
    assert len(modules) > 50 and PACKAGE / "workers" / "drafter_worker.py" in modules
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line}: imports {name}"
           for path in modules
           for line, name in _imported_modules(ast.parse(path.read_text()))
           if name == "pipeline.driver" or name.startswith("pipeline.driver.")]
    assert not bad, "lower modules import the driver package:\n" + "\n".join(bad)


def test_the_check_sees_an_upward_import():
    tree = ast.parse("from pipeline.driver.job import Driver\nfrom pipeline import driver\n"
                     "def f():\n    import pipeline.driver.scheduler\n")
    names = [name for _, name in _imported_modules(tree)]
    assert names == ["pipeline.driver.job.Driver", "pipeline.driver",
                     "pipeline.driver.scheduler"]
