"""Admission: when a request would finish if queued now, and refusing what would finish too late.

The prediction is the batcher's own: each queued request costs its share of the cheapest batch
at its own length (`min over n of predict(n, L) / n`, the cost model), which is what length
grouping serves it in at best; only the work that will be served before or beside it counts
(its priority and more urgent ones), spread over the concurrent batch slots, after the batches
running now. What shares leave out (padding to a neighbour, a cut short of the cheapest size,
other work on the machine) is measured, not guessed: the pace, seconds a batch really took per
second its members were priced at, scales the queued work. (Before it, and before the cost
model's super-linear term, 11 of ~200 admitted requests of a real 1000-request burst answered
504; on the virtual clock, batches 10 % slower than priced give such 504s, 20 % give 25.)
"""

from __future__ import annotations

from ferry.batcher.cost_model import BatchCostModel
from ferry.batcher.dispatch import Dispatch
from ferry.batcher.errors import QueueFull
from ferry.batcher.observer import BatchObserver
from ferry.batcher.policy import BatchLimits, most_at
from ferry.batcher.queue import RequestQueue

# The cost model errs both ways on a shared machine, and a burst's own parsing slows the batches
# that serve it after they were priced: admit only what fits in this share of the time left
# before the deadline (0.9 let 11 of ~240 admitted requests of a real 1000-request burst answer
# 504; on the virtual clock 0.85 absorbs batches 15 % slower than priced, at 0.87x served).
ADMISSION_SHARE = 0.85
# The share of a model's queue places one request may take: the rest stay for everyone else
# (issue 48: one request of 32,768 rows, in 1,024 chunks, filled the whole queue, and small
# clients saw 429s and a 5 s p99 until it drained).
REQUEST_QUEUE_SHARE = 0.5
# Lengths whose price is kept between refits (a request's length is bounded by the model's, but
# a plain graph's element count is not): past this many the prices are computed afresh.
PRICED_LENGTHS = 4096


def request_places(limits: BatchLimits) -> int:
    """The queue places (items, or a plain graph's chunks) one request may take; past them it
    is invalid, not a 429 that no retry would lift."""
    return max(1, int(limits.max_queue_size * REQUEST_QUEUE_SHARE))


class Admission:
    def __init__(
        self,
        limits: BatchLimits,
        queue: RequestQueue,
        cost_model: BatchCostModel,
        dispatch: Dispatch,
        observer: BatchObserver,
    ) -> None:
        self.limits = limits
        self._queue = queue
        self._cost_model = cost_model
        self._dispatch = dispatch
        self._observer = observer
        # Prices by length, valid for one fit of the cost model (its `fits`): every request is
        # priced, and best_share's search is most of admission's cost per request.
        self._prices: dict[int, float] = {}
        self._priced_fit = -1

    def request_cost_s(self, length: int) -> float:
        """One request's share of the cheapest batch at its length (0 before the cost model is
        ready). Not of a full batch: large batches of long sequences cost more per request."""
        model = self._cost_model
        if not model.ready:
            return 0.0
        if self._priced_fit != model.fits or len(self._prices) >= PRICED_LENGTHS:
            self._prices.clear()
            self._priced_fit = model.fits
        price = self._prices.get(length)
        if price is None:
            price = model.best_share(length, most_at(self.limits, length))[1]
            self._prices[length] = price
        return price

    def reprice(self) -> None:
        """Price every queued request again (after a refit of the cost model): a share priced
        before it (0 before the model was ready) would otherwise stay stale while it waits."""
        self._queue.reprice(self.request_cost_s)

    def _running_s(self) -> float:
        """What the batches running now add before queued work starts (the recent batch time)."""
        return self._dispatch.recent_batch_s if self._dispatch.running else 0.0

    def predicted_wait_s(self, priority: int, extra_s: float = 0.0) -> float | None:
        """When a request of `priority` costing `extra_s` would finish if queued now.

        None while the cost model is not ready (nothing to go by yet).
        """
        if not self._cost_model.ready:
            return None
        work = extra_s + self._queue.work_up_to(priority)
        return self._running_s() + work * self._dispatch.pace / self.limits.max_concurrent_batches

    def admit(
        self,
        count: int,
        own_s: float,
        now: float,
        deadline: float | None,
        priority: int,
    ) -> None:
        """Refuse now (429) `count` requests the bounded queue has no room for, what the queue
        ahead would make finish after its deadline (504), and what would make a queued request
        finish after its own. `own_s`: the newcomer's predicted work (its requests'
        `request_cost_s`, summed once by `submit`).

        Only deadlines count: a latency objective is a target that steers batch sizes, and
        refusing at it would turn every burst into 429s. Less urgent work queued does not count
        against a request; its deadlines do (those requests were admitted on a prediction that
        the newcomer would break).
        """
        if len(self._queue) + count > self.limits.max_queue_size:
            self._observer.rejected("queue_full")
            raise QueueFull(retry_after_s=self.retry_after_s())
        if not self._queue:
            return
        if deadline is not None:
            wait = self.predicted_wait_s(priority, own_s)
            if wait is not None and wait > (deadline - now) * ADMISSION_SHARE:
                self._observer.rejected("predicted_late")
                raise QueueFull(
                    retry_after_s=max(1.0, wait - (deadline - now)),
                    message=f"the queue ahead would take {wait:.1f}s, past this request's deadline",
                )
        if self._would_make_late(priority, own_s, now):
            self._observer.rejected("predicted_late")
            raise QueueFull(
                retry_after_s=self.retry_after_s(),
                message="it would make less urgent queued requests miss their deadlines",
            )

    def _would_make_late(self, priority: int, extra_s: float, now: float) -> bool:
        """Whether `extra_s` more work at `priority` makes a queued request finish past its
        share of the time left to its deadline, when it would have made it without.

        Only less urgent requests are served after the newcomer: those of its own priority
        queued before it go first (arrival order, up to the fairness window). A request already
        predicted late stops no one: it is not the newcomer that makes it miss.
        """
        if all(level <= priority for level in self._queue.work_by_priority):
            return False
        slots = self.limits.max_concurrent_batches
        running = self._running_s()
        pace = self._dispatch.pace
        # Per less urgent level: the work of every more urgent level, then its own in arrival
        # order up to each request (the insertion-ordered queue is arrival order).
        before = {
            level: sum(s for other, s in self._queue.work_by_priority.items() if other < level)
            for level in self._queue.work_by_priority
            if level > priority
        }
        for request in self._queue:
            level = request.priority
            if level <= priority:
                continue
            before[level] += request.cost_s
            if request.deadline is None:
                continue
            allowed = (request.deadline - now) * ADMISSION_SHARE
            finish = running + before[level] * pace / slots
            if finish <= allowed < finish + extra_s * pace / slots:
                return True
        return False

    def retry_after_s(self) -> float:
        """How long the queue ahead takes to drain (at least 1 s)."""
        wait = self.predicted_wait_s(max(self._queue.work_by_priority, default=0))
        if wait is None:
            batches_ahead = len(self._queue) / self.limits.max_batch_size
            wait = (
                batches_ahead / self.limits.max_concurrent_batches * self._dispatch.recent_batch_s
            )
        return max(1.0, wait)
