"""The replay (bench/replay.py): the real batcher on a virtual clock, a cost table for a backend."""

from __future__ import annotations

import pytest

from ferry.bench.replay import policies, replay
from ferry.bench.replay_costs import CostTable

pytestmark = pytest.mark.unit

# 10 ms per batch whatever its shape, except the table's own growth: 1 ms per extra request.
FLAT = CostTable(
    sizes=(1, 2),
    lengths=(8, 16),
    seconds=((0.010, 0.010), (0.011, 0.011)),
)


def test_the_cost_table_interpolates_between_and_beyond_its_grid():
    assert FLAT(1, 12) == pytest.approx(0.010)
    assert FLAT(4, 8) == pytest.approx(0.013)  # extrapolated: +1 ms a request
    table = CostTable((1, 2), (8, 16), ((0.008, 0.016), (0.010, 0.020)))
    assert table(1, 12) == pytest.approx(0.012)
    assert table(2, 12) == pytest.approx(0.015)


def test_first_come_first_served_on_two_slots_is_exactly_two_per_service_time():
    # 8 clients, 2 slots, 10 ms each: 200 req/s; each request waits for 3 rounds ahead of it.
    figures = replay(policies([])["fcfs"], FLAT, "short", requests=400, clients=8)
    assert figures.req_per_s == pytest.approx(200, rel=1e-6)
    assert figures.p50_ms == pytest.approx(40) and figures.p99_ms == pytest.approx(40)
    assert figures.mean_batch == 1


def test_a_replay_is_deterministic_and_batching_pays_on_a_fixed_cost():
    first = replay(policies([])["ferry"], FLAT, "short", requests=400, clients=8)
    assert first == replay(policies([])["ferry"], FLAT, "short", requests=400, clients=8)
    assert first.req_per_s > 300  # batches of several cost little more than one


def test_urgent_requests_are_served_ahead_of_the_rest():
    # Every 8th request is urgent: it waits for a running batch at most, not for the queue.
    figures = replay(policies([])["ferry"], FLAT, "short", 400, clients=8, urgent_every=8)
    assert figures.urgent_ratio is not None and figures.urgent_ratio < 0.5
    assert replay(policies([])["ferry"], FLAT, "short", 400, clients=8).urgent_ratio is None
