"""`python -m pipeline.train_single` in a run folder: it takes the folder's lock like
`pipeline.train`, and refuses a folder that holds a pipeline.train run's checkpoints (it would
overwrite that run's metrics and export without resuming anything)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.driver.runlock import RunLock

ROOT = Path(__file__).resolve().parents[1]


def _run(tiny_assets, out: Path) -> tuple[int, str]:
    env = dict(os.environ, DFLASH_ASSETS_DIR=tiny_assets.root)
    proc = subprocess.run([sys.executable, "-m", "pipeline.train_single",
                           f"train.out_dir={out}", "train.plan.max_steps=1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_folder_with_checkpoints_is_refused_in_one_line(tiny_assets, tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints" / "step_00000004").mkdir(parents=True)
    code, text = _run(tiny_assets, out)
    assert code == 2, text[-2000:]
    (line,) = [x for x in text.splitlines() if "[ERROR]" in x]
    assert "holds 1 checkpoint(s) of a pipeline.train run (newest step_00000004)" in line
    assert "Traceback" not in text and not (out / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_live_folder_is_refused_naming_its_holder(tiny_assets, tmp_path):
    out = tmp_path / "run"
    with RunLock(out):  # this process holds it, as a live pipeline.train would
        code, text = _run(tiny_assets, out)
    assert code == 2, text[-2000:]
    (line,) = [x for x in text.splitlines() if "[ERROR]" in x]
    assert "in use by another job" in line and f"pid {os.getpid()}" in line, line
