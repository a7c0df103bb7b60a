"""What an output record was made from: its input line, and the settings that shape an answer.

Each record carries ``"fingerprint": {"input": ..., "target": ..., "chat_template": ...,
"enable_thinking": ..., "max_new_tokens": ...}``: the sha256 of its raw input line, and of the
target (config, weights, tokenizer, generation config) and its chat template, cut to 16 hex
digits, with the two settings as they were. A resume compares them record by record before
any model loads (pipeline/regen/runner.py), so answers from another input file or other
settings are never kept under a run's own. What only decides how answers are computed
(device, dtype, engine, batch sizes) is left out: resuming on another machine is allowed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional

from pipeline.job.resume_contract import (file_parts, parts_digest, target_config_digest,
                                          target_weights_digest)

KEY = "fingerprint"
# Compared in this order: the first that differs is the one named.
SETTINGS = ("target", "chat_template", "enable_thinking", "max_new_tokens")
DIGITS = 16  # of a sha256: enough to tell two files apart, short in every record
# Where a tokenizer and its generation limits are read from; the chat template apart.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt",
                    "special_tokens_map.json", "added_tokens.json", "generation_config.json")
_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
_TOKENIZER_CONFIG = "tokenizer_config.json"


def _short(parts: list[bytes]) -> str:
    return parts_digest(parts)[:DIGITS]


def _tokenizer_config(folder: Path) -> dict:
    path = folder / _TOKENIZER_CONFIG
    return json.loads(path.read_text()) if path.is_file() else {}


def target_identity(folder: Path) -> str:
    """The target's config and weights (as resumes of training identify them), its tokenizer
    and generation config; the chat template is apart (:func:`chat_template_identity`)."""
    parts = [target_config_digest(folder).encode(), target_weights_digest(folder).encode()]
    parts += file_parts(folder, _TOKENIZER_FILES)
    config = {k: v for k, v in _tokenizer_config(folder).items() if k != "chat_template"}
    parts.append(json.dumps(config, sort_keys=True).encode())
    return _short(parts)


def chat_template_identity(folder: Path) -> str:
    """The chat template's sources: its own files, and tokenizer_config.json's field."""
    parts = [json.dumps(_tokenizer_config(folder).get("chat_template")).encode()]
    return _short(parts + file_parts(folder, _TEMPLATE_FILES))


def settings_of(target_path: str, enable_thinking: bool, max_new_tokens: int
                ) -> dict[str, Any]:
    folder = Path(target_path)
    return {"target": target_identity(folder), "chat_template": chat_template_identity(folder),
            "enable_thinking": enable_thinking, "max_new_tokens": max_new_tokens}


def describe(name: str, value: Any) -> str:
    """A setting's value as a user sets it (the flag) or tells it apart (a digest)."""
    if name == "target":
        return f"--target {value} (a digest of its config, weights, tokenizer files)"
    if name == "chat_template":
        return f"the target's chat template {value} (a digest)"
    if name == "enable_thinking":
        return "--enable-thinking" if value else "--no-enable-thinking"
    return f"--max-new-tokens {value}"


def first_difference(recorded: dict[str, Any], settings: dict[str, Any]
                     ) -> Optional[tuple[str, Any, Any]]:
    """(setting, recorded value, this run's value) of the first setting that differs."""
    for name in SETTINGS:
        if recorded.get(name) != settings[name]:
            return name, recorded.get(name), settings[name]
    return None


class InputLines:
    """The fingerprints of input lines, read in step with the conversations (line indices only
    grow), a line at a time: the input is never held whole, however long a line.

    A line's fingerprint leaves out its end (``\\n`` or ``\\r\\n``): the last line of a file
    reads the same with or without one."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "rb")
        self._index = 0  # of the next line to read

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "InputLines":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def digest(self, index: int) -> str:
        """The fingerprint of line ``index`` (0-based), at or after the last one asked."""
        assert index >= self._index, f"line {index} asked after line {self._index - 1}"
        while self._index < index:
            self._read_line(None)
        h = hashlib.sha256()
        self._read_line(h)
        return h.hexdigest()[:DIGITS]

    def _read_line(self, h: Any) -> None:  # a hashlib object, or None to read past
        held = b""  # a chunk's last "\r", which is the line's end if "\n" follows it
        while True:
            chunk = self._file.readline(1 << 20)
            if not chunk:
                break
            data = held + chunk
            if data.endswith(b"\n"):
                data = data[:-2] if data.endswith(b"\r\n") else data[:-1]
                if h is not None:
                    h.update(data)
                break
            held = b"\r" if data.endswith(b"\r") else b""
            if h is not None:
                h.update(data[:len(data) - len(held)])
        self._index += 1
