"""Chat data -> training samples: reading JSONL, encoding through the chat template, batching.

Importing this package reads nothing; :class:`ChatDataset` does the work when constructed.
"""

from pipeline.data.batching import Batch, collate, epoch_order, micro_batches
from pipeline.data.config import DataConfig
from pipeline.data.dataset import ChatDataset, Sample
from pipeline.data.encode import encode_conversation
from pipeline.data.reader import Conversation, DataError, parse_line, read_conversations
from pipeline.data.stats import DataStats

__all__ = [
    "Batch", "ChatDataset", "Conversation", "DataConfig", "DataError", "DataStats", "Sample",
    "collate", "encode_conversation", "epoch_order", "micro_batches",
    "parse_line", "read_conversations",
]
