"""Collection: wait for requests, decide when a batch closes and which requests it takes.

Shaped after Ray Serve's `wait_for_batch` (block on the first request, wait only the rest of the
delay window) and TGI's queue (bounded, drop entries whose caller has gone).
"""

from __future__ import annotations

from ferry.batcher.cost_model import BatchCostModel
from ferry.batcher.dispatch import Dispatch
from ferry.batcher.observer import BatchObserver
from ferry.batcher.policy import (
    BatchLimits,
    batch_is_full,
    best_prefix,
    growth_order,
    most_at,
    within_rows,
)
from ferry.batcher.queue import RequestQueue
from ferry.batcher.request import QueuedRequest
from ferry.batcher.types import Clock, clock_or_loop


class Collection:
    def __init__(
        self,
        limits: BatchLimits,
        queue: RequestQueue,
        cost_model: BatchCostModel,
        dispatch: Dispatch,
        observer: BatchObserver,
        clock: Clock | None,
    ) -> None:
        self.limits = limits
        self._queue = queue
        self._cost_model = cost_model
        self._dispatch = dispatch  # reads whether batches run, and the recent batch time
        self._observer = observer
        self._clock = clock

    async def next_batch(self) -> list[QueuedRequest]:
        clock = clock_or_loop(self._clock)
        while True:
            if not self._queue:
                await self._queue.wait_for_arrival(clock)
                continue
            queued = self.candidates()
            order = within_rows(queued, growth_order(queued, self.limits), self.limits)
            wait_s = self._wait_for_more_s(queued, order, clock.time())
            if wait_s > 0:
                # An arrival or the end of the wait, whichever comes first, wakes the loop.
                await self._queue.wait_for_arrival(clock, until=clock.time() + wait_s)
                continue
            batch = [queued[i] for i in order[: self._batch_count(queued, order, clock.time())]]
            for request in batch:
                self._queue.remove(request)
            self._observer.queue_depth(len(self._queue))
            return batch

    def candidates(self) -> list[QueuedRequest]:
        """The queued requests the next batch may take, oldest first: the fairness window
        within the most urgent (lowest) priority queued.

        Only those that arrived within `fairness_window` times what batching saves, after the
        oldest: what a batch of the cheapest size at the oldest's length saves over running its
        members one by one (by the cost model). Length grouping and the cost model's cut
        choose within it, but a request is never passed over by one that arrived more than the
        window after it, so it waits about as long as first come, first served would make it
        wait. Where batching saves little (long sequences on a CPU) the window closes and the
        order is arrival order; where it saves much (short ones) the batches have room to grow.
        Before the cost model is ready, the unit is the recent batch time.
        """
        # Strict priorities: a batch holds only the most urgent priority queued.
        queued = self._queue.most_urgent()
        key = queued[0].shape_key
        if key:  # tensors that cannot be padded to each other: only the oldest's kind
            queued = [request for request in queued if request.shape_key == key]
        window = self.limits.fairness_window
        if not self.limits.group_by_length or window is None:
            return queued  # batches in arrival order pass nobody over; None: no window
        oldest = queued[0]
        if self._cost_model.ready:
            length = oldest.length
            best, share = self._cost_model.best_share(length, most_at(self.limits, length))
            saved_s = best * (self._cost_model.predict(1, length) - share)
        else:
            saved_s = self._dispatch.recent_batch_s
        cutoff = oldest.enqueued_at + window * saved_s
        count = 1
        while count < len(queued) and queued[count].enqueued_at <= cutoff:
            count += 1
        return queued[:count]

    def _steering_objective(self) -> float | None:
        """The latency objective, once the cost model is ready to steer waits by it."""
        return self.limits.latency_objective_s if self._cost_model.ready else None

    def _wait_for_more_s(self, queued: list[QueuedRequest], order: list[int], now: float) -> float:
        """How long to wait for more requests before closing the batch (0: close it now)."""
        if (not self._dispatch.running and self.limits.dispatch_when_idle) or batch_is_full(
            queued, self.limits
        ):
            return 0.0
        oldest = queued[0]
        objective = self._steering_objective()
        if objective is not None:
            # Wait while the oldest request could still finish a full batch within half its
            # objective: the other half is for the p99 tail.
            longest = max(queued[i].length for i in order)
            full_cost = self._cost_model.predict(self.limits.max_batch_size, longest)
            slack = oldest.enqueued_at + objective / 2 - full_cost - now
            return max(0.0, min(slack, objective / 4))
        return max(0.0, oldest.enqueued_at + self.limits.max_queue_delay_s - now)

    def _batch_count(self, queued: list[QueuedRequest], order: list[int], now: float) -> int:
        """How many of the growth order to take: all of it, or what the cost model finds best."""
        if not (self.limits.cost_model_batching and self._cost_model.ready):
            return len(order)
        oldest = queued[0]
        finish_by = oldest.deadline
        if self.limits.latency_objective_s is not None:
            objective_end = oldest.enqueued_at + self.limits.latency_objective_s
            finish_by = objective_end if finish_by is None else min(finish_by, objective_end)
        lengths = [queued[i].length for i in order]
        budget = None if finish_by is None else finish_by - now
        return best_prefix(lengths, self._cost_model.predict, budget)
