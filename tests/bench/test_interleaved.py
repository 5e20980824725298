"""Ferry and the unbatched server in alternating blocks (bench/interleaved.py)."""

from __future__ import annotations

import pytest

from ferry.bench import interleaved
from ferry.bench.interleaved import block_order, interleave, pooled, report
from ferry.bench.loadgen import LoadResult

pytestmark = pytest.mark.integration


def test_who_goes_first_alternates_by_round():
    assert [block_order(r, ["a", "b"]) for r in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]


async def test_every_block_goes_to_every_server_and_the_rounds_are_pooled():
    sent: list[tuple[str, int]] = []
    # a: 2 s a block; b: 4 s, and one answer of each block of b is a 429.
    rates = {"a": 2.0, "b": 4.0}

    async def send(name: str, block: list[list[int]]) -> LoadResult:
        sent.append((name, len(block)))
        statuses = {200: len(block)} if name == "a" else {200: len(block) - 1, 429: 1}
        return LoadResult([0.1 * (i + 1) for i in range(len(block))], statuses, rates[name])

    blocks = [[[1]] * 10, [[1]] * 6]
    rounds = await interleave(["a", "b"], blocks, send)
    steps = {name: pooled(loads, concurrency=4) for name, loads in rounds.items()}
    assert sent == [("a", 10), ("b", 10), ("b", 6), ("a", 6)]
    assert steps["a"].throughput == pytest.approx(16 / 4.0)
    assert steps["b"].throughput == pytest.approx(14 / 8.0)
    assert (steps["a"].errors, steps["b"].errors) == (0, 2)
    assert [load.throughput for load in rounds["b"]] == pytest.approx([9 / 4.0, 5 / 4.0])
    assert steps["a"].completed == 16


def test_the_report_gives_pooled_and_per_round_ratios():
    rounds = {
        "ferry": [LoadResult([0.1, 0.2, 0.3], {200: 3}, elapsed_s=1.0)],
        "unbatched": [LoadResult([0.2, 0.4, 0.6], {200: 3}, elapsed_s=2.0)],
    }
    steps = {name: pooled(loads, concurrency=4) for name, loads in rounds.items()}
    text = report(rounds, steps)
    assert "ferry / unbatched: 2.000x req/s, p99 0.500x (p50 0.500x); per round 2.000" in text


def test_main_runs_both_real_servers_in_turn(capsys):
    overrides = ["--batching", '{"max_batch_size": 4}']
    args = ["--rounds", "2", "--requests", "12", "--concurrency", "4", "--warmup", "4"]
    status = interleaved.main(args + overrides)
    out = capsys.readouterr().out
    assert status == 0
    assert "2 rounds of 12 requests of 8-128 tokens" in out
    assert 'batching overrides: {"max_batch_size": 4}' in out
    assert "ferry / unbatched:" in out
