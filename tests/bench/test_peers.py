"""bench/peers.py's CPU path: the tiny Llama GGUF through the chain's data stages, a few steps of
each trainer that runs on CPU, every checkpoint exported to z-lab's format and decoded by the
one decoder; speculators (CUDA only) skipped with its reason. The peers come from PyPI into a
folder beside the venv on first use (bench/peers_steps/env.py): a minute, once per machine."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf")
# The race (its subprocess stops at 900 s) and, on a fresh machine, the peers' install first:
# more than the suite's 600 s a test on a slow machine.
pytestmark = pytest.mark.timeout(1200)
ROOT = Path(__file__).resolve().parents[2]
ROW_KEYS = {"trainer", "recipe", "overrides", "command", "status", "time_to_first_step_s",
            "samples_per_s", "tokens_per_s", "peak_gpu_mib", "marks", "tau_humaneval",
            "tau_explain", "draft"}


@pytest.fixture(scope="module")
def peers_env():
    from bench.peers_steps import env

    penv, why = env.peers_env(allow_install=True)
    if why:
        pytest.skip(f"the peers cannot be installed here: {why}")
    return penv


RUNS = ["ours_ce_decay", "ours_distill_dpace", "modelopt_recipe", "modelopt_our_shape",
        "speculators_recipe"]


@pytest.fixture(scope="module")
def race(tmp_path_factory, peers_env):
    tmp = tmp_path_factory.mktemp("peers")
    env = dict(os.environ, RAY_ADDRESS="", DFLASH_GGUF_CACHE=str(tmp / "gguf_cache"))
    done = subprocess.run([sys.executable, "-m", "bench.peers", "--scale", "tiny",
                           "--out", str(tmp / "out"), "--work", str(tmp / "work"),
                           "--runs", *RUNS], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    return tmp, done


@pytest.mark.slow
def test_tiny_race_gives_every_cpu_trainer_a_decoded_tau(race):
    tmp, done = race
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    result = json.loads((tmp / "out" / "peers.json").read_text())
    assert set(result["runs"]) == set(RUNS)
    table = (tmp / "out" / "peers.md").read_text()
    assert all(f"| {name} |" in table for name in RUNS), table
    assert result["versions"]["nvidia-modelopt"] == "0.47.0"
    assert result["versions"]["speculators"] == "0.9.0"
    assert result["train_samples"] == 16 and result["notes"]
    # every trainer's sample set is the pipeline's (bench/peers_steps/samples.py)
    assert 1 <= result["trained_samples"] <= 16 and result["mean_tokens"] > 0
    for name in RUNS[:4]:
        row = result["runs"][name]
        assert row["status"] == "ok", (name, row.get("reason"), row.get("log_tail"))
        assert ROW_KEYS <= set(row), (name, sorted(ROW_KEYS - set(row)))
        assert row["tau_humaneval"] >= 1.0 and row["tau_explain"] >= 1.0
        assert len(row["marks"]) == 3 and row["steps"] >= 1
        assert all(m["tau_humaneval"] >= 1.0 and m["gpu_min"] > 0 for m in row["marks"])
        # CPU in float32: speculative decoding gives the target's own greedy answers
        assert all(m["lossless"][s]["lossless"] for m in row["marks"]
                   for s in ("humaneval", "explain")), name
    assert result["runs"]["modelopt_recipe"]["draft"]["block_size"] == 8  # its recipe's
    spec = result["runs"]["speculators_recipe"]
    assert spec["status"] == "skipped" and "cuda" in spec["reason"]
    assert "speculators_recipe: skipped on cpu" in output  # its reason, printed
    # its untrained checkpoint went through the conversion to the decoder all the same
    assert spec["untrained_dry_run_decoded"]["humaneval"]["tau"] >= 1.0
    assert (tmp / "out" / "peers_data.tar.gz").exists()


@pytest.mark.slow
def test_the_inverse_converter_undoes_speculators_own(race, peers_env):
    """z-lab folder -> speculators' own converter -> bench/peers_steps/zlab.py -> the same."""
    from safetensors.torch import load_file

    from bench.peers_steps.zlab import from_speculators

    tmp, _ = race
    result = json.loads((tmp / "out" / "peers.json").read_text())
    target = result["target_folder"]
    zlab = tmp / "work" / "exports" / "speculators_recipe" / "dry_run"
    theirs, back = tmp / "theirs", tmp / "back"
    code = ("import sys; from speculators.convert.dflash.converter import DFlashConverter; "
            "DFlashConverter().convert(sys.argv[1], sys.argv[2], base_model=sys.argv[3])")
    conv = subprocess.run([sys.executable, "-c", code, str(zlab), str(theirs), target],
                          env=peers_env, capture_output=True, text=True, timeout=300)
    assert conv.returncode == 0, (conv.stdout + conv.stderr)[-3000:]
    from_speculators(theirs, back, result["target"]["layers"])
    a, b = (json.loads((d / "config.json").read_text()) for d in (zlab, back))
    for key in ("block_size", "dflash_config", "hidden_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "num_target_layers"):
        assert a[key] == b[key], key
    wa, wb = load_file(str(zlab / "model.safetensors")), load_file(str(back / "model.safetensors"))
    assert wa.keys() == wb.keys()
    assert all((wa[k] == wb[k]).all() for k in wa)
