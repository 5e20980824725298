"""PrefixCache on its own: longest-prefix lookup, LRU within the byte budget, covered entries
dropped, counters."""

from __future__ import annotations

from ferry.llm.ortgenai_prefix import CachedPrefix, PrefixCache, common_prefix


def entry(name: str, tokens: list[int]) -> CachedPrefix:
    return CachedPrefix(name, tokens)


def test_the_longest_shared_prefix_wins_and_stays_for_the_next() -> None:
    cache = PrefixCache(10_000, 1)
    cache.put(entry("short", [1, 2, 9]))
    cache.put(entry("long", [1, 2, 3, 4, 9]))
    found, reused = cache.lookup([1, 2, 3, 4, 5, 6])
    assert (found.kv, reused) == ("long", 4)
    assert cache.lookup([1, 2, 3, 4, 7, 7])[0] is found  # read, not handed out
    assert len(cache) == 2 and cache.used_bytes == 8
    assert (cache.queries, cache.hits) == (12, 8)  # prompt tokens, as vLLM counts them


def test_a_whole_prompt_match_still_leaves_two_tokens_to_run() -> None:
    cache = PrefixCache(10_000, 1)
    cache.put(entry("g", [1, 2, 3, 4, 5]))
    _, reused = cache.lookup([1, 2, 3, 4])
    assert reused == 2  # never one token alone: it would run other kernels
    assert cache.lookup([1, 2]) == (None, 0)  # nothing left to reuse
    assert cache.lookup([7, 8, 9]) == (None, 0)  # nothing shared
    assert cache.hits == 2


def test_an_entry_the_new_one_starts_with_is_dropped() -> None:
    cache = PrefixCache(10_000, 1)
    cache.put(entry("system", [1, 2, 3]))
    cache.put(entry("other", [1, 2, 7]))
    cache.put(entry("turn", [1, 2, 3, 4, 5]))  # covers "system", not "other"
    assert len(cache) == 2 and cache.used_bytes == 8
    assert cache.lookup([1, 2, 3, 9, 9])[0].kv == "turn"


def test_least_recently_used_goes_first_beyond_the_budget() -> None:
    cache = PrefixCache(3 * 2 * 2, 2)  # three entries of two tokens
    for name in "abc":
        cache.put(entry(name, [ord(name), 0]))
    cache.lookup([ord("a"), 0, 0, 0])  # "a" is the most recent now
    cache.put(entry("d", [ord("d"), 0]))
    assert sorted(e.kv for e in cache._entries.values()) == ["a", "c", "d"]
    assert cache.used_bytes == 12 <= cache.budget_bytes
    cache.put(entry("huge", list(range(7))))  # alone over the budget: never kept
    assert len(cache) == 3
    cache.clear()
    assert len(cache) == 0 and cache.used_bytes == 0


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
