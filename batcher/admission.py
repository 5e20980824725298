"""Admission: how long the queue ahead would take, and refusing what would finish too late."""

from __future__ import annotations

from collections.abc import Sequence

from ferry.batcher.errors import QueueFull
from ferry.batcher.request import TokenSequence
from ferry.batcher.state import BatcherState

# How far back finished batches count towards the queue's drain rate.
RATE_WINDOW_S = 2.0
# Predictions on a shared machine err both ways: admit only what fits with this much to spare.
ADMISSION_MARGIN = 1.5


class Admission(BatcherState):
    def predicted_wait_s(self, extra: int = 0, extra_tokens: int = 0) -> float | None:
        """When `extra` more requests would finish if queued now (None: nothing to go by yet).

        Under load, from the rate at which requests have been finishing over the last
        RATE_WINDOW_S: it already holds the machine's real speed (other batches at once, other
        processes). Otherwise from the cost model: the queue in full batches of its mean
        length, `max_concurrent_batches` at a time, after the batches running now.
        """
        queued = len(self._pending) + extra
        if queued == 0:
            return 0.0
        rate = self._completion_rate()
        if rate is not None:
            return queued / rate
        if not self.cost_model.ready:
            return None
        mean_length = max(1, round((self._pending_tokens + extra_tokens) / queued))
        size = min(self.limits.max_batch_size, max(1, self.limits.max_batch_tokens // mean_length))
        batches = -(-queued // size)
        rounds = -(-batches // self.limits.max_concurrent_batches)
        per_batch = self.cost_model.predict(min(size, queued), mean_length)
        running = self._recent_batch_s if self._running else 0.0
        return running + rounds * per_batch

    def _completion_rate(self) -> float | None:
        """Requests finished per second over the recent window, if batches kept finishing."""
        now = self._running_clock().time()
        while self._completions and self._completions[0][0] < now - RATE_WINDOW_S:
            self._completions.popleft()
        if len(self._completions) < 2:
            return None
        span = now - self._completions[0][0]
        done = sum(count for _, count in list(self._completions)[1:])
        return done / span if span > 0 and done else None

    def _admit_by_predicted_wait(
        self, sequences: Sequence[TokenSequence], now: float, deadline: float | None
    ) -> None:
        """Refuse now (429) what the queue ahead would make finish after its deadline (504).

        Only the deadline counts: a latency objective is a target that steers batch sizes, and
        refusing at it would turn every burst into 429s.
        """
        if deadline is None or not self._pending:
            return
        tokens = sum(seq.length for seq in sequences)
        wait = self.predicted_wait_s(len(sequences), tokens)
        if wait is not None and now + wait * ADMISSION_MARGIN > deadline:
            self._observer.rejected("predicted_late")
            raise QueueFull(
                retry_after_s=max(1.0, wait),
                message=f"the queue ahead would take {wait:.1f}s, past this request's deadline",
            )

    def _retry_after_s(self) -> float:
        """How long the queue ahead takes to drain at the recent batch rate (at least 1 s)."""
        batches_ahead = len(self._pending) / self.limits.max_batch_size
        per_slot = batches_ahead / self.limits.max_concurrent_batches
        return max(1.0, per_slot * self._recent_batch_s)
