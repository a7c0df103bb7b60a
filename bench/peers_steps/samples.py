"""The training answers as every peer trainer of the race gets them: the pipeline's tokenization
and loss masks (pipeline/data/encode.py), each sequence cut to ``seq_len``, those with at least
one supervised token."""

from __future__ import annotations

import json
from pathlib import Path


def encoded_samples(tokenizer, train_path: str, seq_len: int) -> list[dict]:
    """``{"input_ids", "loss_mask"}`` rows, in file order."""
    from pipeline.data.encode import encode_conversation

    rows = []
    for line in Path(train_path).read_text().splitlines():
        messages = json.loads(line)["messages"]
        for ids, mask in encode_conversation(tokenizer, messages, seq_len):
            if sum(mask):
                rows.append({"input_ids": ids, "loss_mask": mask})
    return rows
