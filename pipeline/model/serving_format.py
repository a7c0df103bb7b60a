"""Save the drafter in the format SGLang, vLLM and z-lab's code load.

A folder with ``config.json`` (a Qwen3 config plus the DFlash fields), ``model.safetensors``
(bf16 by default) holding ``layers.{i}.*``, ``fc.weight``, ``hidden_norm.weight`` and
``norm.weight`` (no embedding, no LM head), and ``modeling_dflash.py``, which ``auto_map`` names
so that ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` builds the drafter.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Union

import torch
from safetensors.torch import save_file

from pipeline.runtime.diskfull import DISK_FULL, disk_full_error, rust_os_error, temp_name, writing
from pipeline.checks.dtypes import DTYPES
from pipeline.model.drafter import DFlashDrafter
from pipeline.serving.layout import (AUTO_MAP, MODELING_FILE, check_config, check_tensors,
                                     verify_export)

PathLike = Union[str, os.PathLike]


def drafter_state_dict(model: DFlashDrafter, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The persistent weights, detached, contiguous, on CPU, in the export dtype."""
    return {name: t.detach().to("cpu", dtype).contiguous()
            for name, t in model.state_dict().items()}


def save_drafter(model: DFlashDrafter, out_dir: PathLike, dtype: str = "bfloat16") -> Path:
    """Write config.json + model.safetensors + the modeling file into ``out_dir`` (created if
    needed). They are written and verified in a staging folder beside it and moved in only
    when all are complete: a failed export (a full disk: DiskFullError naming the file) leaves
    no partial file, and an earlier export in ``out_dir`` as it was."""
    if dtype not in DTYPES:
        raise ValueError(f"export dtype={dtype!r} is not allowed: expected one of {list(DTYPES)}")
    out = Path(out_dir)
    config = dict(model.spec.hf_config, torch_dtype=dtype, auto_map=AUTO_MAP)
    state = drafter_state_dict(model, DTYPES[dtype])
    # Checked before anything is written: a naming regression must not leave an export behind.
    check_config(config, str(out))
    check_tensors(config, {name: t.shape for name, t in state.items()}, str(out))
    staging = temp_name(out.resolve())
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
        _write_export(staging, out, config, state)
        verify_export(staging)
        if out.exists():  # files of the user's beside an earlier export stay
            for path in staging.iterdir():
                os.replace(path, out / path.name)
        else:
            os.rename(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _write_export(staging: Path, out: Path, config: dict, state: dict[str, torch.Tensor]) -> None:
    """The export's files into ``staging``; a full disk names the file in ``out``."""
    with writing(out / "config.json"):
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    try:
        save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
    except Exception as exc:  # SafetensorError keeps the errno only in its message
        code = rust_os_error(exc)
        if code in DISK_FULL:
            raise disk_full_error(out / "model.safetensors", code) from exc
        raise
    with writing(out / MODELING_FILE.name):
        shutil.copyfile(MODELING_FILE, staging / MODELING_FILE.name)
    # safetensors creates its file 0600 whatever the umask; the export is read as the run's
    # other files are (by the group, under umask 002): the mode open() gave config.json.
    os.chmod(staging / "model.safetensors", stat.S_IMODE((staging / "config.json").stat().st_mode))

