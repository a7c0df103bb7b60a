"""Checks on the job's input files, run in the driver before Ray or any actor starts.

A missing file found inside an actor's constructor surfaces as a long actor-death traceback
after the cluster started; found here it is one line naming the config key.
"""

from __future__ import annotations

import json
from pathlib import Path

# Files a tokenizer can be built from (fast tokenizer, SentencePiece, or BPE vocabulary).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


class PreflightError(ValueError):
    """The job cannot start; the message is one line that names the config key."""


def check_target_folder(key: str, value: str, folder: str) -> None:
    """``folder`` (``value`` resolved) holds config.json, safetensors weights and a tokenizer."""
    path = Path(folder)
    where = f"{key}={value!r}" + ("" if value == folder else f" ({folder})")
    if not path.is_dir():
        raise PreflightError(f"{where}: no such folder; expected a local HF model folder, "
                             "a .gguf file or builtin:tiny")
    if not (path / "config.json").is_file():
        raise PreflightError(f"{where}: no config.json in the folder")
    _check_weights(where, path)
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise PreflightError(f"{where}: no tokenizer in the folder; expected one of "
                             f"{list(TOKENIZER_FILES)}")


def _check_weights(where: str, path: Path) -> None:
    if (path / "model.safetensors").is_file():
        return
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        raise PreflightError(f"{where}: no model.safetensors or model.safetensors.index.json "
                             "in the folder (safetensors weights are required)")
    try:
        shards = set(json.loads(index.read_text())["weight_map"].values())
    except (ValueError, KeyError, AttributeError) as e:
        raise PreflightError(f"{where}: {index.name} has no readable weight_map ({e})") from None
    missing = sorted(s for s in shards if not (path / s).is_file())
    if missing:
        raise PreflightError(f"{where}: {index.name} names {len(missing)} missing shard(s): "
                             f"{missing[:3]}{' ...' if len(missing) > 3 else ''}")


def check_data_file(key: str, value: str, file: str) -> None:
    """``file`` (``value`` resolved) is a readable, non-empty file."""
    path = Path(file)
    where = f"{key}={value!r}" + ("" if value == file else f" ({file})")
    if not path.exists():
        raise PreflightError(f"{where}: no such file")
    if not path.is_file():
        raise PreflightError(f"{where}: not a file")
    try:
        with open(path, "rb") as f:
            empty = not f.read(1)
    except OSError as e:
        raise PreflightError(f"{where}: cannot be read ({e.strerror})") from None
    if empty:
        raise PreflightError(f"{where}: the file is empty")
