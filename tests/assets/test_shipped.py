"""The tiny assets shipped with the package: what a fresh directory gets (copied, not built),
used only where they are this code's build and intact; otherwise the build runs."""

import json
import logging
import os
import shutil
from functools import partial
from pathlib import Path

import pytest

from pipeline.assets import cache, ensure_tiny_assets
from pipeline.assets.cache_entry import LISTING
from pipeline.assets.shipped import (SUMS, copy_shipped, ship, shipped_dir, why_unusable,
                                     write_sums)


def _no_build(out_dir):
    raise AssertionError("built, though a usable shipped build was at hand")


def _fake_build(calls, out_dir):
    calls.append(out_dir)
    shutil.copytree(shipped_dir(), out_dir, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(SUMS))
    return {"build_time_s": 0.0}


def test_the_shipped_build_is_this_codes():
    # Fails after a recipe change (ASSETS_VERSION bumped) until `python -m pipeline.assets.shipped`.
    assert why_unusable(shipped_dir()) is None


def test_a_fresh_directory_gets_the_shipped_files_without_a_build(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "build_tiny_assets", _no_build)
    assets = ensure_tiny_assets(str(tmp_path / "tiny"))
    shipped = shipped_dir()
    names = sorted(str(p.relative_to(shipped)) for p in shipped.rglob("*")
                   if p.is_file() and p.name != SUMS)
    copied = sorted(str(p.relative_to(assets.root)) for p in Path(assets.root).rglob("*")
                    if p.is_file() and p.name != LISTING)
    assert copied == names and "target/model.safetensors" in names
    # Beside them, the sizes and sums each later use checks them against.
    listed = json.loads((Path(assets.root) / LISTING).read_text())["files"]
    assert sorted(listed) == names
    assert all((shipped / n).read_bytes() == (Path(assets.root) / n).read_bytes() for n in names)
    assert sorted(os.listdir(tmp_path)) == ["tiny", "tiny.lock"]


def _altered_copy(tmp_path, change):
    """A shipped build in a folder of its own (sums written as shipped), then ``change``d."""
    folder = ship(str(shipped_dir()), root=tmp_path / "shipped")
    change(folder)
    return folder


def _edit_a_line(folder):
    path = folder / "data" / "train.jsonl"
    path.write_text(path.read_text().replace("a", "b", 1))


def _another_recipe(folder):
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["recipe"]["train_steps"] += 1
    (folder / "manifest.json").write_text(json.dumps(manifest))
    write_sums(folder)  # intact files, of another recipe


@pytest.mark.parametrize("change,words", [(_edit_a_line, "changed since they were shipped"),
                                          (_another_recipe, "another version or recipe")])
def test_an_unusable_shipped_build_is_said_and_the_assets_built(tmp_path, monkeypatch, caplog,
                                                                change, words):
    folder = _altered_copy(tmp_path, change)
    assert words in why_unusable(folder)
    calls = []
    monkeypatch.setattr(cache, "copy_shipped", partial(copy_shipped, folder=folder))
    monkeypatch.setattr(cache, "build_tiny_assets", partial(_fake_build, calls))
    with caplog.at_level(logging.WARNING, logger="pipeline.assets.shipped"):
        ensure_tiny_assets(str(tmp_path / "tiny"))
    assert len(calls) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"{why_unusable(folder)}: building the tiny assets instead"]


def test_a_copy_that_fails_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken(dest):
        open(os.path.join(dest, "half-copied"), "w").close()
        raise OSError("disk full")

    monkeypatch.setattr(cache, "copy_shipped", broken)
    with pytest.raises(OSError, match="disk full"):
        ensure_tiny_assets(str(tmp_path / "tiny"))
    assert os.listdir(tmp_path) == ["tiny.lock"]
