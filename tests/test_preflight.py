"""Missing files, a tap servers cannot capture, or no wandb key stop the job before Ray starts."""

import json
import os
import shutil

import pytest

from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver
from pipeline.checks.preflight import PreflightError, check_data_file, check_target_folder
from tests.driver.cli_run import refused_before_ray


@pytest.fixture()
def target_copy(random_target_dir, tmp_path):
    """A complete target folder: the random Qwen3 plus a tokenizer file."""
    folder = tmp_path / "target"
    shutil.copytree(random_target_dir, folder)
    (folder / "tokenizer.json").write_text("{}")
    check_target_folder("target.path", str(folder), str(folder))
    return folder


@pytest.mark.parametrize("remove,match", [
    ("config.json", "no config.json"),
    ("model.safetensors", "no model.safetensors or model.safetensors.index.json"),
    ("tokenizer.json", r"no tokenizer .*'tokenizer.json'"),
])
def test_target_folder_pieces_are_named(target_copy, remove, match):
    (target_copy / remove).unlink()
    with pytest.raises(PreflightError, match=rf"target.path='{target_copy}': {match}"):
        check_target_folder("target.path", str(target_copy), str(target_copy))


def test_sharded_weights_need_every_shard(target_copy):
    (target_copy / "model.safetensors").rename(target_copy / "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (target_copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(PreflightError, match=r"1 missing shard.*model-00002-of-00002"):
        check_target_folder("target.path", str(target_copy), str(target_copy))


def test_builtin_names_show_the_folder_they_stand_for(tmp_path):
    gone = tmp_path / "gone"
    with pytest.raises(PreflightError, match=rf"target.path='builtin:tiny' \({gone}\): no such"):
        check_target_folder("target.path", "builtin:tiny", str(gone))


@pytest.mark.parametrize("make,match", [
    (None, "no such file"),
    ("dir", "not a file"),
    ("empty", "the file is empty"),
])
def test_data_file_problems_are_named(tmp_path, make, match):
    path = tmp_path / "train.jsonl"
    if make == "dir":
        path.mkdir()
    elif make == "empty":
        path.write_text("")
    with pytest.raises(PreflightError, match=rf"data.train_path='{path}': {match}"):
        check_data_file("data.train_path", str(path), str(path))


@pytest.mark.parametrize("override,match", [
    ("data.train_path=/no/such.jsonl", "data.train_path='/no/such.jsonl': no such file"),
    ("data.heldout_path=/no/held.jsonl", "data.heldout_path='/no/held.jsonl': no such file"),
    ("target.path=/no/model", "target.path='/no/model': no such folder"),
])
def test_driver_stops_on_a_missing_file(tiny_assets, tmp_path, override, match):
    with pytest.raises(PreflightError, match=match):
        Driver(compose_job([override, f"train.out_dir={tmp_path}"]))  # the constructor starts neither Ray nor an actor


def test_driver_refuses_a_last_layer_tap(tiny_assets, tmp_path):
    with pytest.raises(ValueError, match=r"last layer \(7\).*sglang issue 32204"):
        Driver(compose_job(["drafter.target_layer_ids=[1,7]", f"train.out_dir={tmp_path}"]))


@pytest.mark.parametrize("overrides,line", [
    (["data.train_path=/no/such.jsonl"], "data.train_path='/no/such.jsonl': no such file"),
    (["logger=wandb"], "run `wandb login`"),
])
@pytest.mark.slow
def test_train_cli_says_it_in_one_line(tiny_assets, tmp_path, overrides, line):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(DFLASH_ASSETS_DIR=tiny_assets.root, RAY_ADDRESS="", HOME=str(tmp_path),
               NETRC=str(tmp_path / ".netrc"), WANDB_CONFIG_DIR=str(tmp_path / "wandb"))
    output = refused_before_ray(env, *overrides, f"train.out_dir={tmp_path / 'run'}")
    assert [text for text in output.splitlines() if line in text], output[-3000:]
