"""Every benchmark under bench/ is a maintained one: docs/BENCHMARKS.md names it with its
command, and on CPU it imports and reads its command line. The benches' own CPU runs at tiny
sizes are in the other files of tests/bench/."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
BENCHMARKS = ROOT / "docs" / "BENCHMARKS.md"


def _entry_points() -> list[str]:
    """bench modules run as ``python -m bench.NAME`` (those with a ``__main__`` block)."""
    return sorted(p.stem for p in BENCH.glob("*.py")
                  if '__name__ == "__main__"' in p.read_text())


def _scripts() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.sh"))


def test_every_bench_is_named_in_benchmarks_with_its_command():
    text = BENCHMARKS.read_text()
    missing = [f"python -m bench.{name}" for name in _entry_points()
               if f"python -m bench.{name}" not in text]
    missing += [f"bench/{name}" for name in _scripts() if f"bench/{name}" not in text]
    assert not missing, f"docs/BENCHMARKS.md names no command for: {missing}"


def test_every_command_benchmarks_names_exists():
    named = set(re.findall(r"python -m bench\.([a-z_0-9]+)", BENCHMARKS.read_text()))
    gone = sorted(name for name in named
                  if not (BENCH / f"{name}.py").exists() and not (BENCH / name).is_dir())
    assert not gone, f"docs/BENCHMARKS.md names benches that are not in bench/: {gone}"


@pytest.mark.parametrize("name", _entry_points())
def test_bench_imports_and_reads_its_command_line(name, monkeypatch, capsys):
    module = importlib.import_module(f"bench.{name}")
    if "argparse" not in Path(module.__file__).read_text():
        return  # a plot with fixed inputs: importing it is its smoke test here
    monkeypatch.setattr(sys, "argv", [f"bench.{name}", "--help"])
    try:
        module.main(["--help"])
    except TypeError:  # a main() that reads sys.argv itself
        with pytest.raises(SystemExit) as done:
            module.main()
        assert done.value.code == 0
    except SystemExit as done:
        assert done.code == 0
    else:
        pytest.fail(f"bench.{name} --help did not stop at its usage")
    assert "usage" in capsys.readouterr().out.lower()
