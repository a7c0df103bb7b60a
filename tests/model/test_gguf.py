"""A GGUF file as ``target.path``: converted once into a cached HF folder that loads through
the normal path, and trained through ``python -m pipeline.train`` with the reference's losses.

The GGUF is a tiny Llama written by the ``gguf`` package's writer (pipeline/assets/
tiny_gguf.py) with the demo's byte-level BPE and ChatML template, as SmolLM2's file is laid out.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")

from pipeline.assets import resolve_target_path  # noqa: E402
from pipeline.assets.family_targets import tiny_base_tokenizer  # noqa: E402
from pipeline.assets.tiny_gguf import tiny_llama, write_gguf  # noqa: E402
from pipeline.assets import gguf as gguf_mod  # noqa: E402
from pipeline.checks.preflight import PreflightError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MASK_ID = 3  # the demo tokenizer's <|mask|>; a GGUF carries no mask token


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    """(HF model, tokenizer, path of the GGUF written from them)."""
    tokenizer = tiny_base_tokenizer()
    model = tiny_llama(tokenizer, seed=3)
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    write_gguf(model, tokenizer, str(path))
    return model, tokenizer, path


@pytest.fixture(scope="module")
def chat_file(tmp_path_factory):
    """24 conversations cut from the help topics (no demo assets to build for them)."""
    from pipeline.assets.corpus import pydoc_topics

    lines = []
    for name, text in pydoc_topics()[:24]:
        chat = [{"role": "user", "content": f"Explain {name}."},
                {"role": "assistant", "content": text[:300]}]
        lines.append(json.dumps({"messages": chat}))
    path = tmp_path_factory.mktemp("chats") / "chats.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def gguf_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf_cache")


def _converted(path, cache, monkeypatch) -> str:
    monkeypatch.setenv(gguf_mod.ENV_VAR, str(cache))
    return resolve_target_path(str(path))


def test_converted_once_then_reused_silently(tiny_source, gguf_cache, tmp_path, monkeypatch,
                                             caplog):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer, path = tiny_source
    with caplog.at_level(logging.INFO, logger="pipeline.assets.gguf"):
        folder = _converted(path, gguf_cache, monkeypatch)
    lines = [r.getMessage() for r in caplog.records if r.name == "pipeline.assets.gguf"]
    assert len(lines) == 1 and "converting GGUF" in lines[0] and folder in lines[0]
    assert Path(folder).name == gguf_mod.file_sha256(str(path))
    assert sorted(os.listdir(gguf_cache)) == sorted([Path(folder).name, Path(folder).name
                                                     + ".lock"])  # no temp folder left
    # Same content under another name: the same folder, nothing logged.
    copy = tmp_path / "renamed.gguf"
    shutil.copy(path, copy)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline.assets.gguf"):
        assert _converted(copy, gguf_cache, monkeypatch) == folder
    assert not [r for r in caplog.records if r.name == "pipeline.assets.gguf"]

    # The folder loads through the plain HF path: the same weights (llama.cpp's q/k row
    # order undone), in the dtype asked; the same tokenizer, chat template and eos.
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    theirs, ours = model.state_dict(), loaded.state_dict()
    assert theirs.keys() == ours.keys()
    for name in theirs:
        assert torch.equal(theirs[name], ours[name]), name
    assert AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).dtype == \
        torch.bfloat16
    config = json.loads((Path(folder) / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    converted = AutoTokenizer.from_pretrained(folder)
    text = "def f(x):\n    return x ** 2  # <|im_end|> naïve"
    assert converted(text)["input_ids"] == tokenizer(text)["input_ids"]
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "there"}]
    assert (converted.apply_chat_template(chat, tokenize=False)
            == tokenizer.apply_chat_template(chat, tokenize=False))
    # Byte-level BPE: the folder says no space clean-up (what decoding does anyway), so
    # transformers does not warn on each load; decoding is unchanged.
    saved = json.loads((Path(folder) / "tokenizer_config.json").read_text())
    assert saved["clean_up_tokenization_spaces"] is False
    ids = tokenizer("a , b . c ! don 't")["input_ids"]
    assert converted.decode(ids) == tokenizer.decode(ids) == "a , b . c ! don 't"
    generation = json.loads((Path(folder) / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.eos_token_id == converted.eos_token_id


def test_missing_gguf_package_is_refused_in_one_line(tiny_source, tmp_path, monkeypatch):
    real = gguf_mod.importlib.util.find_spec
    monkeypatch.setattr(gguf_mod.importlib.util, "find_spec",
                        lambda name: None if name == "gguf" else real(name))
    monkeypatch.setenv(gguf_mod.ENV_VAR, str(tmp_path / "cache"))
    with pytest.raises(PreflightError) as e:
        resolve_target_path(str(tiny_source[2]))
    line = str(e.value)
    assert "\n" not in line and "['gguf']" in line and "pip install -e .[gguf]" in line
    assert not (tmp_path / "cache").exists()  # refused before anything was written


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(PreflightError, match="no such GGUF file"):
        resolve_target_path(str(tmp_path / "absent.gguf"))


@pytest.mark.slow
def test_trains_through_the_cli_like_the_reference(tiny_source, gguf_cache, chat_file,
                                                   tmp_path, monkeypatch):
    from pipeline.driver.compose import compose_job
    from pipeline.reference.trainer import SingleProcessTrainer

    path = tiny_source[2]
    _converted(path, gguf_cache, monkeypatch)  # converted by the test above or now
    over = ["drafter.init=random", f"drafter.mask_token_id={MASK_ID}", "drafter.num_layers=1",
            "cluster.drafters_per_node=1", "cluster.cpus_per_actor=0.5",
            "train.plan.max_steps=3", "data.micro_batch_size=2", "train.eval.every=-1",
            "train.export_dtype=float32", "train.optim.lr=1e-3", "train.optim.warmup_ratio=0.0",
            f"target.path={path}", f"data.train_path={chat_file}",
            f"data.heldout_path={chat_file}"]
    env = dict(os.environ, RAY_ADDRESS="", **{gguf_mod.ENV_VAR: str(gguf_cache)})
    proc = subprocess.run([sys.executable, "-m", "pipeline.train", *over,
                           f"train.out_dir={tmp_path / 'ray'}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "converting GGUF" not in output  # the cached conversion, reused silently
    rows = [json.loads(x) for x in (tmp_path / "ray" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    history = SingleProcessTrainer(compose_job(over + [f"train.out_dir={tmp_path / 'ref'}"])
                                   ).train()
    assert len(losses) == len(history) == 3
    for loss, row in zip(losses, history):
        assert loss == pytest.approx(row["train/loss"], rel=1e-5)
    export = json.loads((tmp_path / "ray" / "export" / "config.json").read_text())
    assert export["dflash_config"]["mask_token_id"] == MASK_ID
