"""The build recipe on a micro scale: deterministic, and the manifest says what was built."""

import dataclasses
import filecmp
import os

import pytest

from pipeline.assets.build import build_tiny_assets
from pipeline.assets.recipe import TinyRecipe

MICRO = dataclasses.replace(TinyRecipe(), train_steps=3, warmup_steps=1, num_train=4,
                            num_heldout=2, max_new_tokens=6, min_assistant_tokens=1)


@pytest.fixture(scope="module")
def micro_build(tmp_path_factory):
    """(folder, manifest) of one micro build, which both tests below check."""
    folder = tmp_path_factory.mktemp("micro")
    return folder, build_tiny_assets(str(folder), MICRO)


@pytest.mark.slow
def test_build_is_deterministic(micro_build, tmp_path):
    a, manifest_a = micro_build
    b = tmp_path / "b"
    b.mkdir()
    manifest_b = build_tiny_assets(str(b), MICRO)
    files = ["target/model.safetensors", "target/config.json", "target/tokenizer.json",
             "data/train.jsonl", "data/heldout.jsonl"]
    match, mismatch, errors = filecmp.cmpfiles(a, b, files, shallow=False)
    assert (mismatch, errors) == ([], [])
    assert manifest_a["data"] == manifest_b["data"]
    assert manifest_a["target_loss_first_last"] == manifest_b["target_loss_first_last"]


def test_manifest_records_the_build(micro_build):
    tmp_path, manifest = micro_build
    assert manifest["recipe"] == dataclasses.asdict(MICRO)
    assert manifest["data"]["train"]["kept"] == 4 and manifest["data"]["heldout"]["kept"] == 2
    for split in ("train", "heldout"):
        assert manifest["data"][split]["rounds"] >= 1
    assert manifest["build_time_s"] > 0 and set(manifest["timings_s"]) == {
        "tokenizer", "train_target", "generate_data"}
    assert os.path.exists(tmp_path / "manifest.json")


def test_build_generates_until_the_planned_count(tmp_path):
    # Answers of at least 6 tokens (re-tokenized), with at most 6 generated, from a 3-step
    # target: many come out short, and the build draws again until it has its plan.
    recipe = dataclasses.replace(MICRO, min_assistant_tokens=6, prompt_slack=0.0)
    manifest = build_tiny_assets(str(tmp_path), recipe)
    for split, wanted in (("train", 4), ("heldout", 2)):
        stats = manifest["data"][split]
        assert stats["kept"] == wanted
        assert stats["prompts"] >= stats["kept"] + stats["too_short"]
        with open(tmp_path / "data" / f"{split}.jsonl") as f:
            assert sum(1 for _ in f) == wanted
