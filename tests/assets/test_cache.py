"""Caching, locking and path resolution, with a fake (instant) build."""

import dataclasses
import json
import os
import threading
import time

import pytest

from pipeline.assets import cache, ensure_tiny_assets, resolve_data_path, resolve_target_path
from pipeline.assets.recipe import ASSETS_VERSION, TinyRecipe

RECIPE = json.loads(json.dumps(dataclasses.asdict(TinyRecipe())))


@pytest.fixture
def fake_build(monkeypatch):
    """Replace the real build with one that writes a manifest; returns the call log."""
    calls = []

    def build(out_dir):
        calls.append(out_dir)
        time.sleep(0.2)  # long enough for concurrent callers to overlap
        with open(os.path.join(out_dir, "manifest.json"), "w") as f:
            json.dump({"version": ASSETS_VERSION, "recipe": RECIPE, "build_time_s": 0.2}, f)
        return {"build_time_s": 0.2}

    monkeypatch.setattr(cache, "build_tiny_assets", build)
    monkeypatch.setattr(cache, "copy_shipped", lambda dest: False)  # the build path itself
    return calls


def test_concurrent_callers_build_once(tmp_path, fake_build):
    root = str(tmp_path / "tiny")
    results = []
    threads = [threading.Thread(target=lambda: results.append(ensure_tiny_assets(root)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake_build) == 1 and len(results) == 4
    assert len(set(results)) == 1 and results[0].root == root
    assert results[0].train_path == os.path.join(root, "data", "train.jsonl")
    # The build ran in a sibling temp dir that was renamed into place: nothing left over.
    assert sorted(os.listdir(tmp_path)) == ["tiny", "tiny.lock"]


def test_second_call_does_not_rebuild(tmp_path, fake_build):
    ensure_tiny_assets(str(tmp_path / "tiny"))
    ensure_tiny_assets(str(tmp_path / "tiny"))
    assert len(fake_build) == 1


def test_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken(out_dir):
        open(os.path.join(out_dir, "half-written"), "w").close()
        raise RuntimeError("boom")

    monkeypatch.setattr(cache, "build_tiny_assets", broken)
    monkeypatch.setattr(cache, "copy_shipped", lambda dest: False)
    with pytest.raises(RuntimeError, match="boom"):
        ensure_tiny_assets(str(tmp_path / "tiny"))
    assert os.listdir(tmp_path) == ["tiny.lock"]


def test_env_var_chooses_the_directory(tmp_path, monkeypatch, fake_build):
    monkeypatch.setenv("DFLASH_ASSETS_DIR", str(tmp_path / "from-env"))
    assets = ensure_tiny_assets()
    assert assets.root == str(tmp_path / "from-env")
    assert resolve_target_path("builtin:tiny") == assets.target_dir
    assert resolve_data_path("builtin:tiny", "train") == assets.train_path
    assert resolve_data_path("builtin:tiny", "heldout") == assets.heldout_path


def test_real_paths_pass_through_and_bad_names_are_rejected(monkeypatch, fake_build):
    assert resolve_target_path("/models/qwen3") == "/models/qwen3"
    assert resolve_data_path("/data/chat.jsonl", "train") == "/data/chat.jsonl"
    with pytest.raises(ValueError, match=r"'builtin:huge' names no built-in.*'builtin:tiny'"):
        resolve_target_path("builtin:huge")
    with pytest.raises(ValueError, match="split='test'.*'train', 'heldout'"):
        resolve_data_path("builtin:tiny", "test")
    assert fake_build == []


def test_foreign_directory_and_old_version_are_refused(tmp_path, fake_build):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "something").write_text("x")
    with pytest.raises(ValueError, match="holds no finished asset build"):
        ensure_tiny_assets(str(foreign))
    old = tmp_path / "old"
    old.mkdir()
    (old / "manifest.json").write_text(json.dumps({"version": "tiny-v0"}))
    with pytest.raises(ValueError, match="version 'tiny-v0'.*delete the directory"):
        ensure_tiny_assets(str(old))
    assert fake_build == []


def test_a_build_of_another_recipe_under_this_version_is_refused(tmp_path, fake_build):
    # A recipe changed without bumping ASSETS_VERSION: the cache named after the version
    # would otherwise hand out the old build as if it were the new recipe's.
    stale = tmp_path / "stale"
    stale.mkdir()
    steps = RECIPE["train_steps"]
    (stale / "manifest.json").write_text(json.dumps(
        {"version": ASSETS_VERSION, "recipe": dict(RECIPE, train_steps=steps + 1)}))
    with pytest.raises(ValueError, match=rf"another recipe \(train_steps {steps + 1} -> {steps}\); "
                                         r"delete the directory"):
        ensure_tiny_assets(str(stale))
    assert fake_build == []
    (stale / "manifest.json").write_text(json.dumps({"version": ASSETS_VERSION, "recipe": RECIPE}))
    assert ensure_tiny_assets(str(stale)).root == str(stale)
