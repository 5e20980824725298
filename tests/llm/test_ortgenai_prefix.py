"""PrefixCache on its own: longest-prefix lookup within a scope, LRU within one byte budget for
every model, covered entries dropped, counters, and lookups that do not walk the entries."""

from __future__ import annotations

from collections import OrderedDict

import pytest

from ferry.llm.ortgenai_prefix import NODE_BYTES, CachedPrefix, ModelPrefixCache, PrefixCache

pytestmark = pytest.mark.unit

SCOPE = ("m", None)


def entry(name: str, tokens: list[int], scope: object = SCOPE) -> CachedPrefix:
    return CachedPrefix(name, tokens, scope, len(tokens))


def test_the_longest_shared_prefix_wins_and_stays_for_the_next() -> None:
    cache = PrefixCache(10_000)
    cache.put(entry("short", [1, 2, 9]))
    cache.put(entry("long", [1, 2, 3, 4, 9]))
    found, reused = cache.lookup(SCOPE, [1, 2, 3, 4, 5, 6])
    assert (found.kv, reused) == ("long", 4)
    assert cache.lookup(SCOPE, [1, 2, 3, 4, 7, 7])[0] is found  # read, not handed out
    assert len(cache) == 2 and cache.used_bytes == 8


def test_a_whole_prompt_match_still_leaves_two_tokens_to_run() -> None:
    cache = PrefixCache(10_000)
    cache.put(entry("g", [1, 2, 3, 4, 5]))
    _, reused = cache.lookup(SCOPE, [1, 2, 3, 4])
    assert reused == 2  # never one token alone: it would run other kernels
    assert cache.lookup(SCOPE, [1, 2]) == (None, 0)  # nothing left to reuse
    assert cache.lookup(SCOPE, [7, 8, 9]) == (None, 0)  # nothing shared


def test_a_prompt_sent_again_whole_reuses_all_of_it_where_its_logits_are_kept() -> None:
    cache = PrefixCache(10_000)
    cache.put(CachedPrefix("kept", [1, 2, 3, 4, 5], SCOPE, 5, logits="last"))
    cache.put(entry("bare", [1, 2, 7, 8]))  # keys and values only (no logits)
    found, reused = cache.lookup(SCOPE, [1, 2, 3, 4, 5])
    assert (found.kv, reused) == ("kept", 5)  # nothing left to run
    assert cache.lookup(SCOPE, [1, 2, 7, 8])[1] == 2  # its last logits unknown: a tail runs
    assert cache.lookup(SCOPE, [1, 2, 3, 4])[1] == 2  # a prefix of an entry: no logits of its own
    assert cache.lookup(SCOPE, [1, 2, 3, 4, 5, 6])[1] == 4
    assert cache.lookup(SCOPE, [1, 2, 3, 4, 5], whole=False)[1] == 3  # a tail runs, if asked


def test_an_entry_the_new_one_starts_with_is_dropped() -> None:
    cache = PrefixCache(10_000)
    cache.put(entry("system", [1, 2, 3]))
    cache.put(entry("other", [1, 2, 7]))
    cache.put(entry("turn", [1, 2, 3, 4, 5]))  # covers "system", not "other"
    cache.put(entry("again", [1, 2, 3, 4, 5]))  # the same tokens: the newer one stays
    assert len(cache) == 2 and cache.used_bytes == 8
    assert cache.lookup(SCOPE, [1, 2, 3, 9, 9])[0].kv == "again"
    assert cache.lookup(SCOPE, [1, 2, 7, 9, 9])[0].kv == "other"


def test_least_recently_used_goes_first_beyond_the_budget() -> None:
    cache = PrefixCache(3 * 2)  # three entries of two tokens
    for name in "abc":
        cache.put(entry(name, [ord(name), 0]))
    cache.lookup(SCOPE, [ord("a"), 0, 0, 0])  # "a" is the most recent now
    cache.put(entry("d", [ord("d"), 0]))
    assert sorted(e.kv for e in cache._entries.values()) == ["a", "c", "d"]
    assert cache.lookup(SCOPE, [ord("b"), 0, 0]) == (None, 0)  # its branch is gone too
    cache.put(entry("huge", list(range(7))))  # alone over the budget: never kept
    assert len(cache) == 3 and cache.used_bytes == 6


@pytest.mark.parametrize(
    "other", [("m", "salt-b"), ("m", None), ("other-model", "salt-a")], ids=str
)
def test_nothing_is_shared_across_scopes(other: tuple[str, str | None]) -> None:
    """A victim's prompt under one salt (or model) is invisible to every other scope: the
    attacker's lookups find nothing, however much of it they guess."""
    cache = PrefixCache(10_000)
    victim = [5, 4, 8, 2, 1, 7, 7]
    cache.put(entry("victim", victim, ("m", "salt-a")))
    assert cache.lookup(other, [*victim, 0, 0]) == (None, 0)
    cache.put(entry("attacker", victim, other))  # same tokens, other scope: both kept
    assert len(cache) == 2
    assert cache.lookup(("m", "salt-a"), [*victim, 0, 0])[0].kv == "victim"
    assert cache.lookup(other, [*victim, 0, 0])[0].kv == "attacker"


def test_one_budget_covers_every_model() -> None:
    store = PrefixCache(3 * (10 + NODE_BYTES) * 4)  # twelve tokens of a model of 10 B/token
    first, second = ModelPrefixCache(store, "a", 10), ModelPrefixCache(store, "b", 10)
    first.put(None, [1, 2, 3, 4], "a1")
    first.put(None, [5, 6, 7, 8], "a2")
    second.put(None, [1, 2, 3, 4], "b1")
    second.put(None, [9, 9, 9, 9], "b2")  # over the one budget: the oldest (a's) goes
    assert store.used_bytes <= store.budget_bytes and len(store) == 3
    assert first.lookup(None, [1, 2, 3, 4, 0, 0]) == (None, 0)
    assert second.lookup(None, [1, 2, 3, 4, 0, 0])[0].kv == "b1"
    assert (second.queries, second.hits) == (6, 4)  # per model, as vLLM counts them
    second.clear()  # its engine closes: only its entries go
    assert [e.kv for e in store._entries.values()] == ["a2"]


class _Unwalkable(OrderedDict):
    """Entries that refuse to be walked: a lookup must find its entry without that."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("a lookup walked the entries")

    items = values = keys = __iter__  # type: ignore[assignment]


def test_a_lookup_walks_the_prompt_not_the_entries() -> None:
    """Thousands of unique prompts: a lookup follows the prompt's own path, one step per
    token, and never walks the entries (O(prompt length), not O(entries))."""
    cache = PrefixCache(10**9)
    for i in range(3000):
        cache.put(entry(str(i), [i, i + 1, i + 2, 7, 7, 7]))
    cache._entries = _Unwalkable(cache._entries)
    found, reused = cache.lookup(SCOPE, [1500, 1501, 1502, 7, 9, 9])
    assert (found.kv, reused) == ("1500", 4)
    assert cache.lookup(SCOPE, [9999, 1, 2, 3]) == (None, 0)
