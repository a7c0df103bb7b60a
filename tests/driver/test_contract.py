"""The resume contract and what a rerun does: a changed setting that defines the weights or the
sample plan is refused before any actor starts (one line naming key, old and new value); the
others resume and are logged; a rerun resumes by default; resume=null on checkpoints is
refused; all checkpoints unusable is one warning, then a fresh start.

One real 2-step CLI run (checkpoints at steps 1 and 2) serves the whole module; the refusals
construct the Driver only (the check runs in its __init__, before Ray). Its rerun as it was
has nothing to train.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.checkpoint import folders as ckpt
from pipeline.job.config import JobConfig
from pipeline.driver.compose import compose_job
from pipeline.job.resume_contract import (CHANGEABLE, CHECKED_AS, FIXED, Contract, check_resume,
                                      leaves)
from pipeline.driver.job import Driver
from pipeline.checks.preflight import PreflightError

ROOT = Path(__file__).resolve().parents[2]


def _base(data: Path, out: Path) -> list[str]:
    return ["cluster.drafters_per_node=1", "cluster.cpus_per_actor=0.5", "train.eval.every=-1",
            "train.plan.max_steps=2", "train.checkpoint.every=1", f"data.train_path={data}",
            f"train.out_dir={out}"]


def _cli(tiny_assets, overrides: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, DFLASH_ASSETS_DIR=tiny_assets.root, RAY_ADDRESS="")
    return subprocess.run([sys.executable, "-m", "pipeline.train", *overrides], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def run(tiny_assets, small_train_file, tmp_path_factory):
    """(out_dir, data file, output) of a finished 2-step run with checkpoints at steps 1 and
    2."""
    out = tmp_path_factory.mktemp("contract") / "run"
    proc = _cli(tiny_assets, _base(small_train_file, out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p.name for p in ckpt.step_folders(out)] == ["step_00000001", "step_00000002"]
    return out, small_train_file, proc.stdout + proc.stderr


def _copy(run, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run[0], out)
    return out


def test_every_config_key_is_fixed_or_changeable():
    keys = set(leaves(JobConfig()))
    assert not FIXED & CHANGEABLE, FIXED & CHANGEABLE
    assert keys - FIXED - CHANGEABLE == set(), "classify the new key(s) in contract.py"
    assert (FIXED | CHANGEABLE) - keys == set(), "contract.py names keys JobConfig lacks"
    assert set(CHECKED_AS) <= FIXED


@pytest.mark.slow
def test_the_checkpoint_records_every_fixed_setting(run):
    state = ckpt.read_state(ckpt.latest(run[0]))
    recorded = state["contract"]["fixed"]
    for key in FIXED:
        assert all(name in recorded for name in CHECKED_AS.get(key, (key,))), key
    assert recorded["drafter.target_layer_ids"] == [1, 3, 5]  # resolved from num_taps=3
    assert state["contract"]["changeable"]["train.plan.max_steps"] == 2


def _target_copy(tiny_assets, tmp_path, edit) -> str:
    folder = tmp_path / "target"
    shutil.copytree(tiny_assets.target_dir, folder)
    edit(folder)
    return f"target.path={folder}"


def _template(folder):
    path = folder / "chat_template.jinja"
    path.write_text(path.read_text() + "\n")


def _weights(folder):
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _config(folder):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["rms_norm_eps"] = 1e-3
    path.write_text(json.dumps(config))


def _data(run, tmp_path) -> str:
    path = tmp_path / "changed.jsonl"
    path.write_text("".join(run[1].read_text().splitlines(True)[:-1]))  # one line less
    return f"data.train_path={path}"


# (what changes, the overrides that change it, the refusal's "key old -> new" parts)
REFUSED = [
    # The target layers init copies follow num_layers: the resolved ids are what counts.
    ("model shape", ["drafter.num_layers=3"],
     ["drafter.num_layers 2 -> 3", "drafter.init_layer_ids [6, 7] -> [5, 6, 7]"]),
    ("taps", ["drafter.num_taps=2"], ["drafter.target_layer_ids [1, 3, 5] -> [1, 5]"]),
    ("taps", ["drafter.target_layer_ids=[1,2,3]"],
     ["drafter.target_layer_ids [1, 3, 5] -> [1, 2, 3]"]),
    # gamma's default follows the block size: the resolved value is what counts.
    ("block size", ["drafter.block_size=8", "drafter.gamma=null"],
     ["drafter.block_size 4 -> 8", "drafter.gamma 1.0 -> 4.0"]),
    ("objective", ["drafter.num_anchors=16", "drafter.gamma=2.0"],
     ["drafter.num_anchors 96 -> 16", "drafter.gamma 1.0 -> 2.0"]),
    ("init", ["drafter.init=random"],
     ['drafter.init "target_layers" -> "random"', "drafter.init_layer_ids [6, 7] -> null"]),
    ("mask token", ["drafter.mask_token_id=5"], ["drafter.mask_token_id 3 -> 5"]),
    ("seed", ["train.seed=1"], ["train.seed 0 -> 1"]),
    ("sample order", ["data.seed=7"], ["data.seed 0 -> 7"]),
    ("max_length", ["data.max_length=128"], ["data.max_length 256 -> 128"]),
    ("batching", ["data.micro_batch_size=4"], ["data.micro_batch_size 2 -> 4"]),
    ("batching", ["data.batching=bucket"], ['data.batching "pad" -> "bucket"']),
    ("batching", ["data.batching=bucket", "data.buckets=[64,256]"], ['data.batching "pad"']),
    ("data format", ["data.enable_thinking=false", "data.format=messages"],
     ["data.enable_thinking true -> false", 'data.format "auto" -> "messages"']),
    ("tokenizer and template", _template, ["target.tokenizer "]),
    ("target weights", _weights, ["target.weights "]),
    ("target config", _config, ["target.config "]),
    ("data content", _data, ["data.content ", "allow_data_change=true resumes"]),
]


@pytest.mark.parametrize("what,change,parts", REFUSED, ids=[f"{r[0]}-{i}"
                                                            for i, r in enumerate(REFUSED)])
def test_a_changed_fixed_setting_is_refused_naming_old_and_new(run, tiny_assets, tmp_path,
                                                               what, change, parts):
    out, data, _ = run
    if change is _data:
        change = [_data(run, tmp_path)]
    elif callable(change):
        change = [_target_copy(tiny_assets, tmp_path, change)]
    with pytest.raises(PreflightError) as info:
        Driver(compose_job(_base(data, out) + change))
    message = str(info.value)
    assert "\n" not in message and "cannot resume from" in message and "step_00000002" in message
    for part in parts:
        assert part in message, (part, message)
    assert f"{len(parts) - ('allow_data_change' in parts[-1])} setting(s)" in message


def test_changed_data_goes_on_when_allowed(run, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        driver = Driver(compose_job(_base(run[1], run[0]) + [_data(run, tmp_path),
                                                   "train.checkpoint.allow_data_change=true"]))
    assert driver.resume.step == 2 and "going on (train.checkpoint.allow_data_change" in caplog.text


def test_changeable_settings_resume_and_each_change_is_logged(run, tiny_assets, tmp_path,
                                                              caplog):
    """The schedule, eval, optimizer and layout may change; so may the paths of identical
    files (they are checked by content)."""
    out, data, _ = run
    moved = tmp_path / "moved.jsonl"
    shutil.copy(data, moved)
    target = _target_copy(tiny_assets, tmp_path, lambda folder: None)
    with caplog.at_level(logging.INFO, logger="pipeline.job.resume_contract"):
        driver = Driver(compose_job(_base(moved, out) + [
            "train.plan.max_steps=4", "train.eval.every=2", "train.optim.lr=1e-3",
            "cluster.drafters_per_node=2", target]))
    assert driver.resume.step == 2
    lines = [r.getMessage() for r in caplog.records]
    for change in ("train.plan.max_steps changed: 2 -> 4", "train.eval.every changed: -1 -> 2",
                   "train.optim.lr changed: 0.01 -> 0.001",
                   "cluster.drafters_per_node changed: 1 -> 2"):
        assert sum(change in line for line in lines) == 1, (change, lines)


def test_a_checkpoint_without_a_contract_is_warned_about_and_its_data_still_checked(
        run, tmp_path, caplog):
    out = _copy(run, tmp_path)
    for folder in ckpt.step_folders(out):  # as written before the contract existed
        state = ckpt.read_state(folder)
        state["data_fingerprint"] = state.pop("contract")["fixed"]["data.content"]
        (folder / "state.json").write_text(json.dumps(state))
    with caplog.at_level(logging.WARNING):
        assert Driver(compose_job(_base(run[1], out) + ["drafter.block_size=8"])).resume.step == 2
    assert "written before resumes were checked" in caplog.text
    with pytest.raises(PreflightError, match="data.content"):
        Driver(compose_job(_base(run[1], out) + [_data(run, tmp_path)]))


def test_all_checkpoints_unusable_is_one_warning_then_a_fresh_start(run, tmp_path, caplog):
    out = _copy(run, tmp_path)
    for folder in ckpt.step_folders(out):
        (folder / "trainer.pt").write_bytes(b"torn")
    with caplog.at_level(logging.WARNING):
        driver = Driver(compose_job(_base(run[1], out)))
    assert driver.resume is None and driver.resume_from is None
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("pipeline")]
    assert len(warnings) == 1, warnings
    assert "none of the 2 checkpoint(s)" in warnings[0]
    assert warnings[0].endswith("starting from step 0")


@pytest.mark.slow
def test_rerun_resumes_by_default_and_logs_what_changed(run, tiny_assets, tmp_path):
    """The command run again (one more step asked for) goes on from the last checkpoint."""
    out = _copy(run, tmp_path)
    proc = _cli(tiny_assets, _base(run[1], out) + ["train.plan.max_steps=3"])
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert "step_00000002 at step 2" in text and "done: 1 steps" in text
    assert "train.plan.max_steps changed: 2 -> 3" in text
    assert ckpt.read_point(ckpt.latest(out)).step == 3


@pytest.mark.slow
def test_rerunning_a_finished_job_trains_nothing_and_exits_0(run, tiny_assets, tmp_path):
    """The same command again: it resumes the newest checkpoint, which holds every step asked
    for, and says so before Ray starts (the bounds by epochs and by stop_at_step are decided
    alike: test_nothing_to_train.py)."""
    assert "done: 2 steps" in run[2] and "tau not evaluated (train.eval.every=-1)" in run[2], \
        run[2][-3000:]
    out = _copy(run, tmp_path)
    again = _cli(tiny_assets, _base(run[1], out))
    text = again.stdout + again.stderr
    assert again.returncode == 0, text[-3000:]
    lines = [line for line in text.splitlines() if "nothing to train" in line]
    assert len(lines) == 1, text[-3000:]
    assert "holds 2 steps, and train.plan.max_steps=2" in lines[0], lines[0]
    assert "Traceback" not in text and "Started a local Ray" not in text, text[-3000:]
    assert [p.name for p in ckpt.step_folders(out)] == ["step_00000001", "step_00000002"]


@pytest.mark.parametrize("override,words", [
    ("train.checkpoint.resume=null", ["train.checkpoint.resume=null", "2 checkpoint(s)",
                                      "would overwrite", "another train.out_dir"]),
    ("drafter.num_layers=3", ["cannot resume from", "drafter.num_layers 2 -> 3"]),
])
@pytest.mark.slow
def test_a_refused_rerun_is_one_line_and_exit_2(run, tiny_assets, override, words):
    proc = _cli(tiny_assets, _base(run[1], run[0]) + [override])
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    assert "Traceback" not in text
    refusal = [line for line in text.splitlines() if words[0] in line]
    assert len(refusal) == 1 and all(w in refusal[0] for w in words), text[-2000:]
    assert [p.name for p in ckpt.step_folders(run[0])] == ["step_00000001", "step_00000002"]


def test_batching_keys_the_mode_does_not_read_may_change(run):
    """Padded micro-batches read micro_batch_size only: buckets and budgets are unused."""
    driver = Driver(compose_job(_base(run[1], run[0]) + ["data.buckets=[64,256]",
                                               "data.tokens_per_micro_batch=2048"]))
    assert driver.resume.step == 2


def test_bucket_keys_are_checked_when_the_mode_reads_them():
    fixed = {"data.batching": "bucket", "data.buckets": [64, 256],
             "data.tokens_per_micro_batch": 1024, "data.micro_batch_size": None}
    state = {"contract": {"fixed": fixed, "changeable": {}}}
    now = Contract({**fixed, "data.buckets": [128, 256]}, {})
    with pytest.raises(PreflightError, match=r"1 setting\(s\).*data.buckets \[64, 256\] -> "
                                             r"\[128, 256\]\. Resume"):
        check_resume(state, now, Path("ck/step_00000004"), allow_data_change=False)
