from dataclasses import dataclass

import pytest

from ferry.batcher.policy import BatchLimits, batch_is_full, best_prefix, growth_order, within_rows

pytestmark = pytest.mark.unit


@dataclass
class Item:
    length: int


@dataclass
class Rows:
    """A tensor request: several rows."""

    length: int
    rows: int


def select_batch(queued, limits):
    """The batch the growth order gives, in arrival order."""
    return [queued[i] for i in sorted(growth_order(queued, limits))]


def test_oldest_request_is_always_in_the_batch():
    queued = [Item(128)] + [Item(8) for _ in range(40)]
    batch = select_batch(queued, BatchLimits(max_batch_size=8, max_batch_tokens=4096))
    assert queued[0] in batch


def test_requests_are_grouped_by_length():
    lengths = [8, 120, 9, 128, 10, 125, 11, 122]
    queued = [Item(n) for n in lengths]
    batch = select_batch(queued, BatchLimits(max_batch_size=4, max_batch_tokens=10_000))
    assert sorted(i.length for i in batch) == [8, 9, 10, 11]


def test_padded_token_budget_bounds_the_batch():
    queued = [Item(100) for _ in range(10)]
    batch = select_batch(queued, BatchLimits(max_batch_size=32, max_batch_tokens=350))
    assert len(batch) == 3


def test_a_single_request_over_the_budget_still_runs_alone():
    batch = select_batch([Item(500), Item(500)], BatchLimits(max_batch_tokens=100))
    assert len(batch) == 1


def test_batch_size_bounds_the_batch():
    queued = [Item(4) for _ in range(50)]
    assert len(select_batch(queued, BatchLimits(max_batch_size=16))) == 16


def test_fifo_mode_takes_requests_in_arrival_order():
    queued = [Item(n) for n in (8, 120, 9)]
    limits = BatchLimits(max_batch_size=2, group_by_length=False)
    assert select_batch(queued, limits) == queued[:2]


def test_batch_is_full_by_count_or_tokens():
    limits = BatchLimits(max_batch_size=4, max_batch_tokens=100)
    assert not batch_is_full([Item(10)] * 3, limits)
    assert batch_is_full([Item(10)] * 4, limits)
    assert batch_is_full([Item(60), Item(50)], limits)


def test_growth_order_starts_with_the_oldest_and_every_prefix_is_a_batch():
    queued = [Item(n) for n in (64, 8, 60, 70, 9)]
    order = growth_order(queued, BatchLimits(max_batch_size=3))
    assert order[0] == 0
    assert [queued[i].length for i in order] == [64, 60, 70]


def test_best_prefix_leaves_out_requests_that_padding_would_waste():
    from ferry.batcher.policy import best_prefix

    def predict(n, length):
        return 0.01 + 0.001 * n * length

    # Taking the 120-token request would pad the three short ones to 120.
    assert best_prefix([10, 10, 10, 120], predict, budget_s=None) == 3
    # Similar lengths batch together: the fixed cost is shared.
    assert best_prefix([100, 96, 98, 99], predict, budget_s=None) == 4
    # A tight budget keeps the batch small; when nothing fits, the smallest batch still goes.
    assert best_prefix([10, 10, 10], predict, budget_s=0.025) == 1
    assert best_prefix([10, 10, 10], predict, budget_s=0.001) == 1


def test_batch_is_full_exactly_at_the_token_limit():
    limits = BatchLimits(max_batch_size=10, max_batch_tokens=100)
    assert batch_is_full([Item(50), Item(50)], limits)
    assert not batch_is_full([Item(50), Item(49)], limits)


def test_fifo_mode_stops_at_the_padded_token_budget_and_keeps_the_items():
    queued = [Item(10), Item(10), Item(10), Item(10)]
    exactly = BatchLimits(max_batch_size=8, max_batch_tokens=30, group_by_length=False)
    assert select_batch(queued, exactly) == queued[:3]
    # Padding counts: a longer third item pads the first two to its length.
    mixed = [Item(10), Item(10), Item(11)]
    assert select_batch(mixed, exactly) == mixed[:2]
    assert growth_order(mixed, BatchLimits(max_batch_tokens=33, group_by_length=False)) == [0, 1, 2]


def test_best_prefix_takes_a_prefix_whose_cost_equals_the_budget():
    from ferry.batcher.policy import best_prefix

    def predict(n, length):  # exact in binary floating point
        return 1.0 + n * length

    assert best_prefix([10, 10, 10], predict, budget_s=predict(2, 10)) == 2


def test_best_prefix_goes_to_the_larger_batch_on_a_tie():
    from ferry.batcher.policy import best_prefix

    def no_fixed_cost(n, length):
        return float(n * length)

    # Every prefix is equally efficient: the tie goes to the larger batch.
    assert best_prefix([8, 8, 8], no_fixed_cost, budget_s=None, tolerance=1.0) == 3


def test_best_prefix_subtracts_the_fixed_cost_from_each_members_own_cost():
    from ferry.batcher.policy import best_prefix

    def predict(n, length):
        return 30.0 + n * length

    # Alone the members would cost 30 and 10 of real work (60 and 40 with the fixed cost);
    # together 30 + 2 * 30 = 90, for 40 of real work: less efficient than 30 in 60 alone.
    # (Counting the fixed cost in each member's own cost would make it 100 in 90: batched.)
    assert best_prefix([30, 10], predict, budget_s=None) == 1


def test_best_prefix_refuses_a_batch_slower_than_its_members_one_after_another():
    def predict(n, length):
        return 10.0 + n * length

    # [10, 30]: 70 together, 20 + 40 = 60 one after another, though 40 of real work in 70
    # beats 10 in 20: refused. [10, 30, 30]: 100 together, exactly 100 one after another, and
    # 70 in 100 is the most efficient: taken (a refused prefix does not end the search).
    assert best_prefix([10, 30], predict, budget_s=None) == 1
    assert best_prefix([10, 30, 30], predict, budget_s=None) == 3
    # [10, 21]: 52 together against 51 one after another: refused by one.
    assert best_prefix([10, 21], predict, budget_s=None) == 1


def test_best_prefix_takes_the_fixed_cost_of_an_empty_batch():
    def predict(n, length):  # 1 s per batch and 1 s per request: the fixed cost is 1, not 2
        return 1 + n + 0.1 * n * length

    # Useful work 2 + 1.5 in 5 s beats 2 in 3 s (counting 2 s as fixed, 1.5 in 5 would not).
    assert best_prefix([10, 5], predict, budget_s=None) == 2


def test_growth_takes_the_shorter_neighbour_on_a_tie_and_fills_the_token_budget_exactly():
    queued = [Item(10), Item(11), Item(9)]
    # Taking 9 pads 1 token, taking 11 pads 1 token: a tie goes to the shorter one.
    assert growth_order(queued, BatchLimits(max_batch_size=2)) == [0, 2]
    same = [Item(10)] * 4
    assert len(growth_order(same, BatchLimits(max_batch_tokens=30))) == 3


def test_limits_refuse_values_that_cannot_work_and_accept_the_smallest_that_can():
    import pytest

    for field in ("max_batch_size", "max_queue_size", "max_concurrent_batches"):
        with pytest.raises(
            ValueError, match=r"^batch size, queue size and concurrent batches must be >= 1$"
        ):
            BatchLimits(**{field: 0})
        assert getattr(BatchLimits(**{field: 1}), field) == 1
    with pytest.raises(ValueError, match=r"^max_queue_delay_s must be >= 0$"):
        BatchLimits(max_queue_delay_s=-0.001)
    assert BatchLimits(max_queue_delay_s=0.0).max_queue_delay_s == 0.0
    with pytest.raises(ValueError, match=r"^max_batch_tokens must be >= 1$"):
        BatchLimits(max_batch_tokens=0)
    assert BatchLimits(max_batch_tokens=1).max_batch_tokens == 1
    for objective in (0.0, -1.0):
        with pytest.raises(ValueError, match=r"^latency_objective_s must be > 0$"):
            BatchLimits(latency_objective_s=objective)
    assert BatchLimits(latency_objective_s=1e-6).latency_objective_s == 1e-6
    with pytest.raises(ValueError, match=r"^fairness_window must be >= 0$"):
        BatchLimits(fairness_window=-0.01)
    assert BatchLimits(fairness_window=0.0).fairness_window == 0.0
    with pytest.raises(ValueError, match=r"^prepared_batches must be >= 0$"):
        BatchLimits(prepared_batches=-1)
    assert BatchLimits(prepared_batches=0).prepared_batches == 0


def test_the_padded_size_counts_both_sides_of_the_anchor():
    # The oldest (5) sorts between 3 and 7: after taking 3 the batch is 2 wide, not 3.
    queued = [Item(5), Item(3), Item(7)]
    assert growth_order(queued, BatchLimits(max_batch_tokens=15)) == [0, 1]


def test_growth_weighs_a_longer_neighbour_by_every_member_it_would_pad():
    # Oldest 5; then 4 (pads nothing); then 2 (costs 3 on its own row) beats 7 (costs 2 on
    # each of the two rows already in): 3 <= 4.
    queued = [Item(5), Item(4), Item(2), Item(7)]
    assert growth_order(queued, BatchLimits(max_batch_size=3)) == [0, 1, 2]


def test_taking_a_longer_request_widens_the_batch_for_the_token_budget():
    # 2 then 9: two rows of 9 (18 tokens) do not fit in 10.
    assert growth_order([Item(2), Item(9)], BatchLimits(max_batch_tokens=10)) == [0]


def test_best_prefix_counts_each_members_own_cost_without_the_batch_fixed_cost_only():
    # 1 s per batch, 1 s per request, 0.1 s per token: the long request costs more in the
    # padded batch (23 s for 13 s of useful work) than the short one alone (2 of 3 s).
    def predict(n: int, length: int) -> float:
        return 1 + n + 0.1 * n * length

    assert best_prefix([10, 100], predict, None) == 1


@pytest.mark.parametrize(
    ("rows", "taken"),
    [
        ([1, 1, 1, 1], 3),  # one row each, as token sequences
        ([2, 1, 1], 2),
        ([3, 1], 1),
        ([5, 1], 1),  # a first member over the limit still runs, alone
        ([1, 3], 1),
    ],
)
def test_max_batch_size_counts_rows(rows, taken):
    queued = [Rows(10, n) for n in rows]
    limits = BatchLimits(max_batch_size=3, max_batch_tokens=10_000)
    order = growth_order(queued, limits)
    assert within_rows(queued, order, limits) == order[:taken]
    assert batch_is_full(queued, limits) == (sum(rows) >= 3)
