"""Each entry point's --help is a page of at most 40 lines: what it does, its main config groups
or options, and 5 to 8 examples; the full lists stay one flag away (Hydra's --hydra-help and
--cfg job, regenerate's --help-all), and every option has a help string."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_EXAMPLE_STARTS = ("python -m", "ray job", "launch/")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("entry,names", [
    ("pipeline.train", ["Config groups", "cluster ", "local, node8, one_gpu", "logger ",
                        "--config-name", "qwen3_8b", "target.path=", "cluster.cpus_per_actor=",
                        "--hydra-help", "--cfg job"]),
    ("pipeline.train_single", ["Config groups", "drafter ", "train.plan.max_steps=",
                               "--hydra-help", "--cfg job"]),
    # torch's import makes these two the slow ones
    pytest.param("pipeline.export", ["--checkpoint", "--out", "--dtype"], marks=pytest.mark.slow),
    pytest.param("pipeline.regenerate", ["--input", "--output", "--engine", "--num-workers",
                                         "--help-all"], marks=pytest.mark.slow),
])
def test_help_is_a_short_page_with_groups_and_examples(entry, names):
    proc = _run(entry, "--help")
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = proc.stdout
    lines = page.splitlines()
    assert len(lines) <= 40, page
    assert lines[0].startswith("usage:") and f"python -m {entry}" in lines[0]
    examples = [line for line in lines if line.strip().startswith(_EXAMPLE_STARTS)]
    assert 5 <= len(examples) <= 8, page
    assert [name for name in names if name not in page] == []


@pytest.mark.slow
def test_hydras_own_help_and_the_config_dump_stay():
    proc = _run("pipeline.train", "--hydra-help")
    assert proc.returncode == 0 and "Hydra" in proc.stdout and "--multirun" in proc.stdout
    proc = _run("pipeline.train", "--cfg", "job", "train.plan.max_steps=7")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "max_steps: 7" in proc.stdout and "cluster:" in proc.stdout


@pytest.mark.slow
def test_regenerates_full_page_lists_every_option():
    proc = _run("pipeline.regenerate", "--help-all")
    assert proc.returncode == 0, proc.stderr[-3000:]
    from pipeline.regenerate import build_parser
    every = [a.option_strings[-1] for a in build_parser()._actions if a.option_strings]
    assert [o for o in every if o not in proc.stdout] == []


@pytest.mark.parametrize("module", ["pipeline.export",
                                    pytest.param("pipeline.regenerate", marks=pytest.mark.slow)])
def test_every_option_has_a_help_string(module):
    parser: argparse.ArgumentParser = __import__(module, fromlist=["build_parser"]).build_parser()
    options = [a for a in parser._actions if a.option_strings]
    assert len(options) >= 4
    assert [a.option_strings for a in options if not (a.help or "").strip()] == []
