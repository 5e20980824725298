"""The checker processes (llm/grammar_pool.py): a grammar that crashes llguidance or outlasts the
compile budget costs one real checker process, which is replaced; the next grammar is checked as
before, and an answer (the crash's too) is remembered."""

from __future__ import annotations

import asyncio

import pytest

from ferry.llm.grammar_bounds import GrammarLimits, GrammarRefused
from ferry.llm.grammar_pool import GrammarPool
from tests.llm.grammars import chained_defs, gbnf_chain
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

# Bounds opened wide, so that the hostile grammars reach llguidance itself.
OPEN = GrammarLimits(max_chars=10**7, max_rules=10**6, compile_timeout_s=1.0)


@pytest.fixture
async def pool():
    checkers = GrammarPool(OPEN, workers=1, cache_entries=2)
    await checkers.start()
    yield checkers
    await checkers.close()


async def replaced(pool: GrammarPool, before: set[int]) -> None:
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(
        None, lambda: wait_until(lambda: pool.pids and pool.pids != before, 30, "a new checker")
    )


@pytest.mark.parametrize(
    ("kind", "text", "said"),
    [
        ("json_schema", chained_defs(1000), "crashed its checker"),  # SIGSEGV
        ("any_grammar", gbnf_chain(8000), "grammar_compile_timeout_s"),  # seconds converting
    ],
)
async def test_a_crash_or_a_timeout_costs_one_checker_and_the_next_grammar_passes(
    pool, kind, text, said
):
    before = pool.pids
    with pytest.raises(GrammarRefused, match=said):
        await pool.check(kind, text)
    await replaced(pool, before)
    assert await pool.check("regex", "[a-z]+") == "[a-z]+"


async def test_a_crash_is_remembered_and_not_repeated(pool):
    with pytest.raises(GrammarRefused):
        await pool.check("json_schema", chained_defs(1000))
    await replaced(pool, set())
    after = pool.pids
    with pytest.raises(GrammarRefused, match="crashed"):
        await pool.check("json_schema", chained_defs(1000))
    assert pool.pids == after  # answered from the cache: no checker died


async def test_a_caller_that_leaves_does_not_cost_the_checker(pool):
    before = pool.pids
    check = asyncio.create_task(pool.check("json_schema", chained_defs(300)))
    await asyncio.sleep(0)
    check.cancel()
    assert await pool.check("regex", "[0-9]+") == "[0-9]+"
    assert pool.pids == before


async def test_the_cache_is_bounded(pool):
    for regex in ("a+", "b+", "c+"):
        await pool.check("regex", regex)
    assert pool.cached == 2
