"""Chat data -> training samples: reading JSONL, encoding through the chat template, batching.

Importing this package reads nothing; :class:`ChatDataset` does the work when constructed.
Its names are imported on first use (PEP 562): ``pipeline.data.config`` is read by the
command line's checks, which must refuse a mistake before torch is imported (seconds).
"""

import importlib

_MODULE_OF = {
    "Batch": "batching", "collate": "batching", "epoch_order": "batching",
    "micro_batches": "batching", "DataConfig": "config", "ChatDataset": "dataset",
    "Sample": "dataset", "encode_conversation": "encode", "Conversation": "reader",
    "DataError": "reader", "parse_line": "reader", "read_conversations": "reader",
    "DataStats": "stats",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value
