"""PrefixCache on its own: longest-prefix lookup, fit, LRU within the byte budget, counters."""

from __future__ import annotations

from ferry.llm.ortgenai_prefix import (
    MIN_KV_LENGTH,
    CachedGenerator,
    PrefixCache,
    common_prefix,
    kv_bytes_per_token,
    kv_length,
)

GREEDY = (("do_sample", False),)


def entry(name: str, tokens: list[int], max_length: int = 512, options=GREEDY) -> CachedGenerator:
    return CachedGenerator(name, tokens, max_length, options)


def test_the_longest_shared_prefix_wins_and_leaves_the_cache() -> None:
    cache = PrefixCache(10_000, 1)
    cache.put(entry("short", [1, 2, 9]))
    cache.put(entry("long", [1, 2, 3, 4, 9]))
    found, reused = cache.take([1, 2, 3, 4, 5, 6], need=10, options=GREEDY)
    assert (found.generator, reused) == ("long", 4)
    assert len(cache) == 1 and cache.used_bytes == 512
    assert (cache.queries, cache.hits) == (6, 4)  # prompt tokens, as vLLM counts them


def test_a_whole_prompt_match_still_leaves_two_tokens_to_run() -> None:
    cache = PrefixCache(10_000, 1)
    cache.put(entry("g", [1, 2, 3, 4, 5]))
    _, reused = cache.take([1, 2, 3, 4], need=5, options=GREEDY)
    assert reused == 2  # never one token alone: it would run other kernels
    cache.put(entry("g", [1, 2, 3, 4, 5]))
    assert cache.take([1, 2], need=5, options=GREEDY) == (None, 0)  # nothing left to reuse


def test_only_a_generator_that_fits_is_taken() -> None:
    cache = PrefixCache(10_000, 1)
    cache.put(entry("small", [1, 2, 3], max_length=8))
    cache.put(entry("hot", [1, 2, 3], options=(("do_sample", True),)))
    assert cache.take([1, 2, 3, 4], need=9, options=GREEDY) == (None, 0)  # too short, or hot
    assert cache.take([7, 8], need=4, options=GREEDY) == (None, 0)  # nothing shared
    assert len(cache) == 2 and cache.hits == 0


def test_least_recently_used_goes_first_beyond_the_budget() -> None:
    freed: list[str] = []
    cache = PrefixCache(3 * 512 * 2, 2, free=freed.append)
    for name in "abc":
        cache.put(entry(name, [ord(name)]))
    taken, _ = cache.take([ord("a"), 0, 0], need=4, options=GREEDY)  # "a" is in use again...
    cache.put(taken)  # ...and back as the most recent
    cache.put(entry("d", [ord("d")]))
    assert freed == ["b"]
    assert cache.used_bytes == 3 * 512 * 2 <= cache.budget_bytes
    cache.put(entry("huge", [1], max_length=4096))  # alone over the budget: never kept
    assert freed == ["b", "huge"] and len(cache) == 3
    cache.clear()
    assert sorted(freed) == ["a", "b", "c", "d", "huge"] and cache.used_bytes == 0


def test_kv_lengths_come_in_buckets_within_the_context() -> None:
    assert kv_length(10, 8192) == MIN_KV_LENGTH
    assert kv_length(513, 8192) == 1024
    assert kv_length(5000, 8192) == 8192
    assert kv_length(300, 256) == 300  # a context shorter than the bucket: what is needed


def test_kv_bytes_per_token_counts_every_layer_key_and_value() -> None:
    decoder = {"num_hidden_layers": 30, "num_key_value_heads": 3, "head_size": 64}
    assert kv_bytes_per_token({**decoder, "num_attention_heads": 9}) == 30 * 2 * 3 * 64 * 4


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
