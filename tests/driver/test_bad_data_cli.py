"""Bad training data, as a user meets it: `python -m pipeline.train` (and the single-process
trainer) with a damaged file. The driver reads and encodes the data before Ray starts, so a bad
line is one line, once, exit 2; with data.on_bad_line=skip each shown bad line appears once
(not again from the prefetcher) and the counts include blank lines.

Ray never started is read from Ray's own "Started a local Ray instance" line; the skip run,
which does start Ray, shows that line, so a Ray that changed its wording fails that test
instead of making the others pass blindly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RAY_STARTED = "Started a local Ray instance"


def _run(module: str, tiny_assets, tmp_path, *overrides: str) -> tuple[int, str]:
    env = dict(os.environ, DFLASH_ASSETS_DIR=tiny_assets.root, RAY_ADDRESS="")
    proc = subprocess.run([sys.executable, "-m", module, f"train.out_dir={tmp_path / 'run'}",
                           *overrides], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def demo_lines(tiny_assets) -> list[str]:
    return Path(tiny_assets.train_path).read_text().splitlines()[:24]


@pytest.mark.slow
@pytest.mark.parametrize("module", ["pipeline.train", "pipeline.train_single"])
def test_a_bad_line_stops_the_job_in_one_line_before_ray(tiny_assets, tmp_path, demo_lines,
                                                         module):
    bad = _write(tmp_path / "bad.jsonl", demo_lines[:4] + ["", '{"messages": [}'] + demo_lines)
    rc, output = _run(module, tiny_assets, tmp_path, f"data.train_path={bad}",
                      "train.plan.max_steps=1")
    assert rc == 2, output[-3000:]
    assert output.count(f"{bad}:6: invalid JSON") == 1, output[-3000:]
    errors = [line for line in output.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and f"{bad}:6: " in errors[0], output[-3000:]
    assert "Traceback" not in output and RAY_STARTED not in output, output[-3000:]


@pytest.mark.slow
def test_a_file_of_bad_lines_is_refused_with_its_counts(tiny_assets, tmp_path):
    bad = _write(tmp_path / "bad.jsonl", ["{cut", "", "[1, 2]", "not json"])
    rc, output = _run("pipeline.train", tiny_assets, tmp_path, f"data.train_path={bad}",
                      "data.on_bad_line=skip")
    assert rc == 2, output[-3000:]
    [error] = [line for line in output.splitlines() if "ERROR" in line]
    assert "no usable sample" in error and \
        "lines=4 = conversations=0 + skipped_bad=3 + blank=1;" in error, output[-3000:]
    assert "Traceback" not in output and RAY_STARTED not in output, output[-3000:]


@pytest.mark.slow
def test_skipped_lines_are_reported_once_and_counted(tiny_assets, tmp_path, demo_lines):
    bad_at = [3, 9, 10]  # 1-based line numbers
    lines = demo_lines[:2] + ["{cut", "", *demo_lines[2:7], "[1]", "", "  ", *demo_lines[7:]]
    lines[9 - 1] = '{"messages": []}'
    bad = _write(tmp_path / "skip.jsonl", lines)
    rc, output = _run("pipeline.train", tiny_assets, tmp_path, f"data.train_path={bad}",
                      "data.on_bad_line=skip", "train.plan.max_steps=1", "train.eval.every=-1",
                      "cluster.drafters_per_node=1")
    assert rc == 0, output[-3000:]
    assert RAY_STARTED in output, "the signal the other tests read is gone: " + output[-2000:]
    for n in bad_at:  # once: not again from the prefetcher, nor by the reader and the summary
        assert output.count(f"{bad}:{n}: ") == 1, output[-3000:]
    assert output.count(f"lines={len(lines)} = conversations={len(lines) - 6} + skipped_bad=3 "
                        f"+ blank=3;") == 1, output[-3000:]
    assert "bad: invalid_json=1 no_turns=1 not_object=1" in output, output[-3000:]
