"""When a batch closes and which queued requests go into it. Pure functions over the queue."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar


class HasLength(Protocol):
    @property
    def length(self) -> int: ...


T = TypeVar("T", bound=HasLength)


@dataclass(frozen=True)
class BatchLimits:
    max_batch_size: int = 32  # requests (rows) per batch
    # Padded tokens (batch size x longest sequence): what a batch really costs to run.
    max_batch_tokens: int = 2048
    # The longest a request waits for its batch to fill (unless the cost model decides).
    max_queue_delay_s: float = 0.002
    # Requests queued at once; beyond it 429 (a request of more items than the whole queue
    # holds is invalid: 422, 400 on /v1).
    max_queue_size: int = 1024
    # Batches running at once: the backend's to say (sessions, concurrency), never the config's.
    max_concurrent_batches: int = 2
    # Batches formed ahead of a free runner, waiting inside a backend that starts them in its own
    # threads (`queues_batches`): a runner that frees takes the next batch at once instead of
    # waiting for the event loop to form and hand one over (1-3 ms a batch, measured).
    prepared_batches: int = 0
    # Sort the queue by length so short requests are not padded to long ones.
    group_by_length: bool = True
    # With no batch running there is nothing to wait for: dispatch at once (lowest latency at
    # low load); batches still grow under load while the running ones keep the backend busy.
    dispatch_when_idle: bool = True
    # A p99 latency objective: when set, the learned cost model decides how long to wait and
    # how many requests to take, instead of max_queue_delay_s and the full batch.
    latency_objective_s: float | None = None
    # Let the learned cost model cut each batch where sequences per second peak (padding a
    # batch to one long request can cost more than running that request apart).
    cost_model_batching: bool = True
    # A request is passed over only by requests that arrived less than this fraction of what
    # batching saves after it (by the cost model: a batch of the best size at the oldest's
    # length against its members one by one; the recent batch time before the model is ready).
    # None: off, batches grouped from the whole queue. 0.5: bench/replay.py, docs/batching.md.
    fairness_window: float | None = 0.5

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_queue_size < 1 or self.max_concurrent_batches < 1:
            raise ValueError("batch size, queue size and concurrent batches must be >= 1")
        if self.prepared_batches < 0:
            raise ValueError("prepared_batches must be >= 0")
        if self.max_batch_tokens < 1:
            raise ValueError("max_batch_tokens must be >= 1")
        if self.max_queue_delay_s < 0:
            raise ValueError("max_queue_delay_s must be >= 0")
        if self.fairness_window is not None and self.fairness_window < 0:
            raise ValueError("fairness_window must be >= 0")
        if self.latency_objective_s is not None and self.latency_objective_s <= 0:
            raise ValueError("latency_objective_s must be > 0")


def most_at(limits: BatchLimits, length: int) -> int:
    """The most requests of `length` tokens one batch may hold (at least one: a request over
    the token limit still runs, alone)."""
    return max(1, min(limits.max_batch_size, limits.max_batch_tokens // length))


def rows_of(item: object) -> int:
    """The rows a queued item brings: a token sequence one, a tensor request its own."""
    return int(getattr(item, "rows", 1))


def batch_is_full(queued: Sequence[HasLength], limits: BatchLimits) -> bool:
    """True once waiting longer cannot make the next batch larger."""
    if sum(rows_of(item) for item in queued) >= limits.max_batch_size:
        return True
    return sum(item.length for item in queued) >= limits.max_batch_tokens


def within_rows(queued: Sequence[T], order: list[int], limits: BatchLimits) -> list[int]:
    """The longest prefix of a growth order whose rows fit max_batch_size (the first member at
    least): max_batch_size counts rows, as Triton's does, and a tensor request brings several.
    Token sequences bring one each, which growth_order counts already."""
    rows = 0
    for count, index in enumerate(order):
        rows += rows_of(queued[index])
        if rows > limits.max_batch_size:
            return order[: max(1, count)]
    return order


def growth_order(queued: Sequence[T], limits: BatchLimits) -> list[int]:
    """Indices into `queued` in the order they would join the batch, the oldest first.

    The oldest request anchors the batch so nothing starves; the batch then grows one request
    at a time towards whichever side of the length-sorted queue adds fewer padded tokens, until
    the size or padded-token limit would be passed. Every prefix is itself a valid batch, which
    is what lets a cost model choose how many to take.
    """
    if not queued:
        return []
    if not limits.group_by_length:
        return list(range(len(_fifo_batch(queued, limits))))
    order = sorted(range(len(queued)), key=lambda i: (queued[i].length, i))
    anchor = order.index(0)
    low = high = anchor
    longest = queued[0].length
    joined = [0]
    while high - low + 1 < limits.max_batch_size:
        size = high - low + 1
        left = queued[order[low - 1]].length if low > 0 else None
        right = queued[order[high + 1]].length if high + 1 < len(order) else None
        # Cost in padded tokens of taking each neighbour.
        left_cost = None if left is None else longest - left
        right_cost = None if right is None else (right - longest) * size
        if left_cost is None and right_cost is None:
            break
        take_left = right_cost is None or (left_cost is not None and left_cost <= right_cost)
        new_longest = longest if take_left else max(longest, right or 0)
        if (size + 1) * new_longest > limits.max_batch_tokens:
            break
        if take_left:
            low -= 1
            joined.append(order[low])
        else:
            high += 1
            joined.append(order[high])
        longest = new_longest
    return joined


def best_prefix(
    lengths: Sequence[int],
    predict_s: Callable[[int, int], float],
    budget_s: float | None,
    tolerance: float = 0.97,
) -> int:
    """How many of a growth order to take: the batch that wastes least, within the budget.

    A batch's efficiency is the work its members would cost at their own lengths over what the
    padded batch costs: `sum(cost(1, L_i) - fixed) / cost(n, L_max)`. The fixed per-batch cost
    rewards size, padding punishes it, and a short request is left for a batch of its own
    length when joining this one would pad it too much. Near-ties (within `tolerance`) go to
    the larger batch. `budget_s` is the time left before the tightest member's deadline or
    objective; when no prefix fits it, the smallest batch goes (small is fastest).

    A batch may not take longer than its members would one after another: past that, every
    member waits longer than a line of them would, and the few percent of throughput it buys
    (long sequences on a CPU) come back as a tail of slow batches (bench/replay.py: mixed
    p99 1.10x first come, first served without this rule, 1.00x with it).
    """
    fixed = predict_s(0, 0)
    best_count, best_efficiency = 1, 0.0
    useful = 0.0
    one_by_one = 0.0
    longest = 0
    for count, length in enumerate(lengths, start=1):
        longest = max(longest, length)
        own = predict_s(1, length)
        useful += own - fixed
        one_by_one += own
        seconds = max(predict_s(count, longest), 1e-9)
        if budget_s is not None and seconds > budget_s:
            break
        if seconds > one_by_one:
            continue
        efficiency = useful / seconds
        if efficiency >= best_efficiency * tolerance:
            best_count, best_efficiency = count, max(efficiency, best_efficiency)
    return best_count


def _fifo_batch(queued: Sequence[T], limits: BatchLimits) -> list[T]:
    batch: list[T] = []
    longest = 0
    for item in queued:
        longest_if_added = max(longest, item.length)
        if batch and (
            len(batch) >= limits.max_batch_size
            or (len(batch) + 1) * longest_if_added > limits.max_batch_tokens
        ):
            break
        batch.append(item)
        longest = longest_if_added
    return batch
