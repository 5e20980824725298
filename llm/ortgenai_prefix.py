"""Prefix reuse for the onnxruntime-genai engine: finished generators kept with their KV state.

A finished request's `og.Generator` still holds the keys and values of every token it computed.
Instead of freeing it, the owner thread parks it here, keyed by those tokens. A new request whose
prompt starts with some of them takes it, rewinds it to the shared prefix (`rewind_to`) and
computes only the rest: a shared system prompt, few-shot examples, or a chat's previous turns.

Bounds: with `past_present_share_buffer` each generator's KV buffer is allocated whole for its
`max_length`, so an entry costs `max_length * bytes_per_token` whatever it holds. Entries are
evicted least recently used first to stay within the byte budget. A generator can serve a request
only if its `max_length` covers the new prompt plus max_tokens, so lengths are rounded up to
buckets (`kv_length`) that leave a chat's next turn room to reuse it.

Same greedy text with or without a hit: onnxruntime's CPU kernels give bit-identical keys, values
and logits for a prompt fed in pieces of any length >= 2 (measured: whole, chunks of 2, 3, 7, 16,
a tail of 2 or 3), but not for a piece of ONE token, which takes the decode kernels (logits off
by up to 1.0). So only keys and values computed from prompt pieces are kept (a generated token
was computed alone), and a hit leaves at least TAIL tokens of the new prompt to run.

Counters follow vLLM's `prefix_cache_queries` / `prefix_cache_hits`: prompt tokens looked up, and
those found. Pure Python (generators are opaque objects here): tested without a model.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

MIN_KV_LENGTH = 512  # the smallest bucket: short chats' next turns still fit
TAIL = 2  # prompt tokens a hit still runs: never one alone (see the module docstring)


def kv_length(need: int, context: int) -> int:
    """The max_length to allocate for `need` tokens: the next power of two, at least
    MIN_KV_LENGTH, never past the model's context."""
    length = MIN_KV_LENGTH
    while length < need:
        length *= 2
    return min(length, max(context, need))


def kv_bytes_per_token(decoder: dict[str, Any], dtype_bytes: int = 4) -> int:
    """Bytes of keys and values one token takes in every layer (genai_config's decoder)."""
    heads = decoder.get("num_key_value_heads", decoder["num_attention_heads"])
    return decoder["num_hidden_layers"] * 2 * heads * decoder["head_size"] * dtype_bytes


@dataclass
class CachedGenerator:
    generator: Any
    tokens: list[int]  # prompt tokens whose keys and values the generator holds, in order
    max_length: int
    options: Hashable  # search options fixed at creation: only a request with equal ones fits


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _covers(new: CachedGenerator, old: CachedGenerator) -> bool:
    """Whether `new` serves every request `old` could: same options, room, and old's tokens."""
    return (
        old.options == new.options
        and old.max_length <= new.max_length
        and new.tokens[: len(old.tokens)] == old.tokens
    )


class PrefixCache:
    """Idle generators by their tokens, LRU within a byte budget. Owner thread only."""

    def __init__(
        self, budget_bytes: int, bytes_per_token: int, free: Callable[[Any], None] | None = None
    ) -> None:
        self.budget_bytes = budget_bytes
        self._per_token = bytes_per_token
        self._free = free or (lambda generator: None)
        self._entries: OrderedDict[int, CachedGenerator] = OrderedDict()  # oldest first
        self._next_key = 0
        self.used_bytes = 0
        self.queries = 0  # prompt tokens looked up (vLLM: prefix_cache_queries)
        self.hits = 0  # of those, tokens found computed (vLLM: prefix_cache_hits)

    def __len__(self) -> int:
        return len(self._entries)

    def cost(self, max_length: int) -> int:
        return max_length * self._per_token

    def take(
        self, prompt: list[int], need: int, options: Hashable
    ) -> tuple[CachedGenerator | None, int]:
        """The idle generator sharing the longest prefix with `prompt` that fits (`need` tokens,
        equal options), removed from the cache, and how many prompt tokens it saves: at most
        len(prompt) - TAIL, so that what runs is computed exactly as without the cache."""
        self.queries += len(prompt)
        best_key, best = None, 0
        for key, entry in self._entries.items():
            if entry.max_length < need or entry.options != options:
                continue
            shared = min(common_prefix(entry.tokens, prompt), len(prompt) - TAIL)
            if shared > best:
                best_key, best = key, shared
        if best_key is None:
            return None, 0
        entry = self._entries.pop(best_key)
        self.used_bytes -= self.cost(entry.max_length)
        self.hits += best
        return entry, best

    def put(self, entry: CachedGenerator) -> None:
        """Park an idle generator as the most recent; evict the oldest beyond the budget."""
        cost = self.cost(entry.max_length)
        if cost > self.budget_bytes or not entry.tokens:
            self._free(entry.generator)
            return
        for key, held in list(self._entries.items()):  # one it covers is no longer needed
            if held is not entry and _covers(entry, held):
                del self._entries[key]
                self.used_bytes -= self.cost(held.max_length)
                self._free(held.generator)
        self._entries[self._next_key] = entry
        self._next_key += 1
        self.used_bytes += cost
        while self.used_bytes > self.budget_bytes:
            _, oldest = self._entries.popitem(last=False)
            self.used_bytes -= self.cost(oldest.max_length)
            self._free(oldest.generator)

    def clear(self) -> None:
        while self._entries:
            _, entry = self._entries.popitem(last=False)
            self._free(entry.generator)
        self.used_bytes = 0
