"""What the batcher reports as it works; `server/metrics.py` turns it into Prometheus series."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

RejectReason = Literal["queue_full", "predicted_late", "deadline", "invalid", "cancelled", "closed"]


@dataclass(frozen=True)
class FormedBatch:
    """A batch as the dispatcher formed it, before it runs (`BatchObserver.batch_formed`)."""

    size: int  # requests
    real_tokens: int  # tokens (tensor elements) its members sent
    padded_tokens: int  # what it holds, padding included
    queue_waits_s: list[float]  # each member's time in the queue
    priority: int  # its members' one priority level (collection.py)
    rows: int  # its members' rows: a plain graph's request may hold many


class BatchObserver(Protocol):
    def queue_depth(self, depth: int) -> None:
        return None

    def rejected(self, reason: RejectReason) -> None:
        return None

    def batch_formed(self, batch: FormedBatch) -> None:
        return None

    def batch_finished(self, seconds: float, failed: bool, predicted_s: float | None) -> None:
        return None

    def cost_model(self, coefficients: dict[str, float]) -> None:
        return None


class NullObserver(BatchObserver):
    """For callers that want no metrics (tests of the batcher alone, benchmarks): the
    protocol's own bodies do nothing."""
