"""Map config strings to paths: ``builtin:tiny`` means the embedded demo assets.

``builtin:tiny-<model_type>`` (target only) means a tiny random-weight target of that family.
A path ending in ``.gguf`` (target only) is a GGUF file, converted once into a cached HF folder
(pipeline/assets/gguf.py). Anything else is taken as a real path and returned unchanged (``~``
expanded), so configs can name either the demo or a user's own model and data.

Every entry point (train, train_single, regenerate, the evaluator through the resolved job)
gets its target folder here, so here its weights are checked: each safetensors header against
its file's size (pipeline/assets/integrity.py), before Ray or any model loads.
"""

from __future__ import annotations

import os
from typing import Optional

from pipeline.assets.cache import ensure_tiny_assets
from pipeline.assets.family_targets import FAMILY_TARGETS, ensure_family_target
from pipeline.assets.gguf import gguf_folder, is_gguf
from pipeline.assets.integrity import check_model_folder

BUILTIN_PREFIX = "builtin:"
BUILTINS = ("tiny",)
SPLITS = ("train", "heldout")


def _builtin_name(value: str) -> Optional[str]:
    if not value.startswith(BUILTIN_PREFIX):
        return None
    name = value[len(BUILTIN_PREFIX):]
    if name not in BUILTINS:
        raise ValueError(f"{value!r} names no built-in assets; allowed: "
                         f"{[BUILTIN_PREFIX + b for b in BUILTINS]}")
    return name


def resolve_target_path(value: str) -> str:
    """``builtin:tiny`` -> the tiny target's folder (built on first use);
    ``builtin:tiny-<model_type>`` -> a tiny random-weight target of that family
    (pipeline/assets/family_targets.py); ``*.gguf`` -> its converted HF folder (converted on
    first use, pipeline/assets/gguf.py); else ``value``. Its weights' headers are checked
    (a missing folder or file is left to pipeline.checks.preflight, which names the config key)."""
    folder = _target_folder(value)
    check_model_folder(folder)
    return folder


def _target_folder(value: str) -> str:
    family = value[len(BUILTIN_PREFIX + "tiny-"):]
    if value.startswith(BUILTIN_PREFIX + "tiny-"):
        if family not in FAMILY_TARGETS:
            raise ValueError(f"target.path={value!r} names no built-in target; allowed: "
                             f"{[BUILTIN_PREFIX + b for b in BUILTINS]} and "
                             f"{[BUILTIN_PREFIX + 'tiny-' + f for f in FAMILY_TARGETS]}")
        return ensure_family_target(family)
    if is_gguf(value):
        return gguf_folder(value)
    if _builtin_name(value) is None:
        return os.path.expanduser(value)
    return ensure_tiny_assets().target_dir


def resolve_data_path(value: str, split: str) -> str:
    """``builtin:tiny`` -> the tiny ``split`` ("train" or "heldout") JSONL; else ``value``."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not allowed: expected one of {list(SPLITS)}")
    if _builtin_name(value) is None:
        return os.path.expanduser(value)
    assets = ensure_tiny_assets()
    return assets.train_path if split == "train" else assets.heldout_path
