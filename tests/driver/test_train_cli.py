import pytest
"""`python -m pipeline.train` on the embedded default: 1 target, 2 drafters, a local Ray."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_train_module_runs_the_embedded_default(tiny_assets, tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, DFLASH_ASSETS_DIR=tiny_assets.root, RAY_ADDRESS="")
    cmd = [sys.executable, "-m", "pipeline.train", "cluster.targets_per_node=1",
           "cluster.drafters_per_node=2", "train.plan.max_steps=6", "train.eval.prompts=2",
           "train.eval.max_new_tokens=8", f"train.out_dir={out}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "export" / "model.safetensors").exists()
    config = json.loads((out / "export" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 4
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert {"perf/drafter0_busy", "perf/drafter1_busy", "perf/target0_busy"} <= train[-1].keys()
    assert [r["step"] for r in rows if "eval/tau" in r] == [0, 6]
    output = proc.stderr + proc.stdout
    assert "done: 6 steps" in output
    # Nothing the user cannot act on: Ray's notice that it chose token authentication for the
    # local cluster, a library's deprecation warning, a trace window wider than the run, the
    # actors' weight-loading progress bars (one line of carriage returns each, through Ray).
    assert "trace of steps 3..6:" in output  # the steps traced, not the window (3..7)
    noise = [line for line in output.splitlines()
             if "Token authentication" in line or "RAY_AUTH_MODE" in line
             or "deprecat" in line.lower() or "FutureWarning" in line
             or "Loading weights" in line]
    assert not noise, "\n".join(noise)
