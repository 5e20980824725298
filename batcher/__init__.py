"""The asyncio micro-batcher: plain request objects in, futures out. Knows nothing of HTTP."""

# One import name: ferry/batcher links here. Imported as `batcher`, each module would load a
# second time, and an exception raised under one name would not be caught under the other.
if __name__ != "ferry.batcher":
    raise ImportError(f"import ferry.batcher, not {__name__}: Ferry's packages have one name")

from ferry.batcher.batcher import MicroBatcher
from ferry.batcher.errors import (
    BatchAbandoned,
    BatcherClosed,
    BatcherError,
    BatchWideFailure,
    DeadlineExceeded,
    InferenceFailed,
    InferenceTimedOut,
    QueueFull,
)
from ferry.batcher.observer import BatchObserver, FormedBatch
from ferry.batcher.packing import TensorPacking, TokenPacking
from ferry.batcher.padding import PaddedBatch, pad_batch, stack_rows, unpad_outputs
from ferry.batcher.policy import BatchLimits
from ferry.batcher.request import SequenceLimits, TokenSequence
from ferry.batcher.tensor_padding import TensorBatch, TensorLayout, TensorRows

__all__ = [
    "BatchAbandoned",
    "BatchLimits",
    "BatchObserver",
    "BatchWideFailure",
    "BatcherClosed",
    "BatcherError",
    "DeadlineExceeded",
    "FormedBatch",
    "InferenceFailed",
    "InferenceTimedOut",
    "MicroBatcher",
    "PaddedBatch",
    "QueueFull",
    "SequenceLimits",
    "TensorBatch",
    "TensorLayout",
    "TensorPacking",
    "TensorRows",
    "TokenPacking",
    "TokenSequence",
    "pad_batch",
    "stack_rows",
    "unpad_outputs",
]
