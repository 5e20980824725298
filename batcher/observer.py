"""What the batcher reports as it works; `server/metrics.py` turns it into Prometheus series."""

from __future__ import annotations

from typing import Literal, Protocol

RejectReason = Literal["queue_full", "predicted_late", "deadline", "invalid", "cancelled", "closed"]


class BatchObserver(Protocol):
    def queue_depth(self, depth: int) -> None:
        return None

    def rejected(self, reason: RejectReason) -> None:
        return None

    def batch_formed(
        self,
        size: int,
        real_tokens: int,
        padded_tokens: int,
        queue_waits_s: list[float],
        priority: int,
    ) -> None:
        return None

    def batch_finished(self, seconds: float, failed: bool, predicted_s: float | None) -> None:
        return None

    def cost_model(self, coefficients: dict[str, float]) -> None:
        return None


class NullObserver(BatchObserver):
    """For callers that want no metrics (tests of the batcher alone, benchmarks): the
    protocol's own bodies do nothing."""
