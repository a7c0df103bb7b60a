"""Cached assets prove they are whole on each use, and are made again where they are not
(pipeline/assets/cache_entry.py); building folders a killed run left are swept."""

import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.assets import cache_entry, ensure_tiny_assets, resolve_target_path
from pipeline.assets.cache_entry import LISTING, recheck_after_failure, sweep_leftovers
from pipeline.assets.shipped import shipped_dir

ROOT = Path(__file__).resolve().parents[2]


def _shipped(name: str) -> bytes:
    return (shipped_dir() / name).read_bytes()


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def _flip(path: Path) -> None:
    """Same size, one byte changed: only a hash tells."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture()
def assets_root(tmp_path):
    """A fresh copy of the demo's assets (the shipped build, no build run)."""
    root = tmp_path / "tiny"
    ensure_tiny_assets(str(root))
    return root


@pytest.mark.parametrize("name, damage, said", [
    ("target/model.safetensors", _cut, "2,111,900 bytes where 2,112,000 were cached"),
    ("target/model.safetensors", _flip, "its sha256 differs from when it was cached"),
    ("data/train.jsonl", _flip, "its sha256 differs from when it was cached"),
    ("target/tokenizer.json", Path.unlink, "missing")])
def test_a_damaged_demo_asset_is_copied_again_in_one_line(assets_root, caplog, name, damage,
                                                          said):
    """Damaged after it was copied, the file was never checked again: every rerun failed the
    same way, deep in the actors. Now the next use finds it and copies the assets again."""
    damage(assets_root / name)
    with caplog.at_level(logging.WARNING, logger="pipeline.assets"):
        assets = ensure_tiny_assets(str(assets_root))
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [f"{assets_root / name}: {said}: the tiny demo assets in {assets_root} "
                      f"are damaged; making them again"]
    assert (Path(assets.root) / name).read_bytes() == _shipped(name)
    assert sorted(os.listdir(assets_root.parent)) == ["tiny", "tiny.lock"]  # nothing aside
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline.assets"):
        ensure_tiny_assets(str(assets_root))
    assert not caplog.records  # whole again: the next use says nothing


def test_a_cut_weights_file_through_the_target_path_is_mended(assets_root, monkeypatch):
    """``builtin:tiny`` as every entry point resolves it."""
    monkeypatch.setenv("DFLASH_ASSETS_DIR", str(assets_root))
    _cut(assets_root / "target" / "model.safetensors")
    folder = resolve_target_path("builtin:tiny")
    assert (Path(folder) / "model.safetensors").read_bytes() == \
        _shipped("target/model.safetensors")


def test_an_entry_cached_before_listings_is_adopted_once(assets_root, caplog):
    (assets_root / LISTING).unlink()
    with caplog.at_level(logging.INFO, logger="pipeline.assets.cache_entry"):
        ensure_tiny_assets(str(assets_root))
        ensure_tiny_assets(str(assets_root))
    assert [r.getMessage() for r in caplog.records] == [
        f"{assets_root}: recorded the sizes and sha256 of its files (cached before they were), "
        f"checked on each use from now on"]
    listed = json.loads((assets_root / LISTING).read_text())["files"]
    assert listed["target/model.safetensors"]["size"] == 2112000


def test_a_large_entry_is_hashed_when_a_load_fails(assets_root, monkeypatch, caplog):
    """Above FULL_CHECK_BYTES (a converted 8B model) each use compares sizes and headers only;
    the sha256 of every file is taken once a load from it fails, and a damaged entry is made
    again. The driver's own load of the tokenizer does that, and retries."""
    from pipeline.driver.compose import compose_job
    from pipeline.job.resolve import resolve_job

    monkeypatch.setattr(cache_entry, "FULL_CHECK_BYTES", 0)
    monkeypatch.setenv("DFLASH_ASSETS_DIR", str(assets_root))
    tokenizer = assets_root / "target" / "tokenizer.json"
    tokenizer.write_bytes(b"#" + tokenizer.read_bytes()[1:])  # same size, no JSON
    assert ensure_tiny_assets(str(assets_root)).root == str(assets_root)  # not seen on use
    assert recheck_after_failure(str(assets_root.parent / "x" / "y")) is None  # no entry
    job = compose_job(["target.path=builtin:tiny", "data.train_path=builtin:tiny",
                       "data.heldout_path=builtin:tiny", f"train.out_dir={assets_root}.run"])
    with caplog.at_level(logging.WARNING, logger="pipeline.assets"):
        resolved = resolve_job(job)
    assert resolved.target_path == str(assets_root / "target")
    assert tokenizer.read_bytes() == _shipped("target/tokenizer.json")
    assert [r.getMessage() for r in caplog.records] == [
        f"{tokenizer}: its sha256 differs from when it was cached: the cached copy was damaged "
        f"after it was made, and is made again"]


def test_regenerate_makes_a_damaged_target_again_when_its_load_fails(assets_root,
                                                                     monkeypatch):
    from pipeline.regen import runner

    monkeypatch.setattr(cache_entry, "FULL_CHECK_BYTES", 0)
    monkeypatch.setenv("DFLASH_ASSETS_DIR", str(assets_root))
    _flip(assets_root / "target" / "model.safetensors")

    def fail(*args, **kwargs):
        raise RuntimeError("the actor died loading the target")

    monkeypatch.setattr(runner, "start_generators", fail)
    plan = runner.Plan(runner.RegenConfig(input=str(assets_root / "data" / "heldout.jsonl"),
                                          output=str(assets_root) + ".out.jsonl"),
                       str(assets_root / "target"), 0, 0, iter(()), None, {}, None)
    with pytest.raises(runner.TargetRemade, match=r"the target failed to load: .*model."
                                                  r"safetensors: its sha256 differs"):
        runner._load_generators(plan, "cpu", None)
    assert (assets_root / "target" / "model.safetensors").read_bytes() == \
        _shipped("target/model.safetensors")


def test_a_conversion_cut_short_is_converted_again(tmp_path, monkeypatch, caplog):
    pytest.importorskip("gguf")
    from pipeline.assets import gguf as gguf_mod
    from pipeline.assets.tiny_gguf import write_tiny_gguf

    monkeypatch.setenv(gguf_mod.ENV_VAR, str(tmp_path / "cache"))
    source = write_tiny_gguf(str(tmp_path / "tiny.gguf"))
    folder = Path(resolve_target_path(source))
    weights = folder / "model.safetensors"
    whole = weights.read_bytes()
    _cut(weights)
    with caplog.at_level(logging.WARNING, logger="pipeline.assets.gguf"):
        assert resolve_target_path(source) == str(folder)
    assert [r.getMessage() for r in caplog.records] == [
        f"{weights}: {len(whole) - 100:,} bytes where {len(whole):,} were cached: the "
        f"conversion of {source} is damaged; converting it again"]
    assert weights.read_bytes() == whole


# --- building folders left behind ----------------------------------------------------------

def test_a_building_folder_left_behind_is_swept_on_the_next_use(assets_root, caplog):
    left = assets_root.parent / ".tiny.building-k3x9q1"
    left.mkdir()
    (left / "half-copied").write_text("x")
    with caplog.at_level(logging.INFO, logger="pipeline.assets.cache_entry"):
        ensure_tiny_assets(str(assets_root))
    assert sorted(os.listdir(assets_root.parent)) == ["tiny", "tiny.lock"]
    assert [r.getMessage() for r in caplog.records] == [
        f"removed 1 folder(s) left in {assets_root.parent} by an interrupted build: "
        f".tiny.building-k3x9q1"]


def test_a_live_builders_folder_is_left_alone(assets_root):
    """A builder holds the entry's lock while it builds: its folder is in use."""
    live = assets_root.parent / ".tiny.building-live01"
    live.mkdir()
    with open(f"{assets_root}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            sweep_leftovers(str(assets_root), f"{assets_root}.lock")
            ensure_tiny_assets(str(assets_root))  # built: it waits for no lock
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    assert live.is_dir()
    sweep_leftovers(str(assets_root), f"{assets_root}.lock")
    assert not live.exists()


_SLOW_COPY = """
import sys, time
from pipeline.assets import cache, shipped

def slow_copy(dest):
    open(dest + "/half-copied", "w").close()
    print("copying", flush=True)
    time.sleep(60)

cache.copy_shipped = slow_copy
cache.ensure_tiny_assets(sys.argv[1])
"""


@pytest.mark.slow
def test_sigkill_during_the_first_copy_leaves_nothing_after_the_rerun(tmp_path):
    root = tmp_path / "tiny"
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_COPY, str(root)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "copying"
        building = [n for n in os.listdir(tmp_path) if n.startswith(".tiny.building-")]
        assert len(building) == 1
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    time.sleep(0.1)
    assets = ensure_tiny_assets(str(root))
    assert sorted(os.listdir(tmp_path)) == ["tiny", "tiny.lock"]
    assert (Path(assets.target_dir) / "model.safetensors").read_bytes() == \
        _shipped("target/model.safetensors")
