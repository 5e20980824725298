"""The asyncio micro-batcher: plain request objects in, futures out. Knows nothing of HTTP."""

from batcher.batcher import MicroBatcher
from batcher.errors import (
    BatchAbandoned,
    BatcherClosed,
    BatcherError,
    BatchWideFailure,
    DeadlineExceeded,
    InferenceFailed,
    InferenceTimedOut,
    InvalidInput,
    QueueFull,
)
from batcher.observer import BatchObserver
from batcher.padding import PaddedBatch, pad_batch, unpad_outputs
from batcher.policy import BatchLimits
from batcher.request import SequenceLimits, TokenSequence

__all__ = [
    "BatchAbandoned",
    "BatchLimits",
    "BatchObserver",
    "BatchWideFailure",
    "BatcherClosed",
    "BatcherError",
    "DeadlineExceeded",
    "InferenceFailed",
    "InferenceTimedOut",
    "InvalidInput",
    "MicroBatcher",
    "PaddedBatch",
    "QueueFull",
    "SequenceLimits",
    "TokenSequence",
    "pad_batch",
    "unpad_outputs",
]
