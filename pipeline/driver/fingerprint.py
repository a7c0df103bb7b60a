"""The training data's fingerprint: a checkpoint's data cursor means something only for the
data it was taken on, so a resume onto changed data stops unless told to go on."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline.training.state_io import sha256_file

log = logging.getLogger(__name__)

KEY = "data_fingerprint"


def data_fingerprint(train_path: str | Path) -> str:
    """sha256 of the training file's bytes (its name may change; its content may not)."""
    return sha256_file(Path(train_path))


def check_data(state: dict[str, Any], fingerprint: str, checkpoint: Path,
               allow_change: bool) -> None:
    recorded = state.get(KEY)
    if recorded is None:
        log.warning("checkpoint %s records no data fingerprint: cannot tell whether the "
                    "training data changed since", checkpoint)
        return
    if recorded == fingerprint:
        return
    message = (f"the training data changed since checkpoint {checkpoint} (fingerprint "
               f"{recorded[:12]} then, {fingerprint[:12]} now), so its data cursor points into "
               f"other samples")
    if not allow_change:
        raise ValueError(f"{message}: resume with the same data.train_path, or set "
                         f"train.checkpoint.allow_data_change=true to go on anyway")
    log.warning("%s; going on (train.checkpoint.allow_data_change=true): samples may be "
                "repeated or missed in this epoch", message)
