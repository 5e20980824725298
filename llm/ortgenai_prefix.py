"""Prefix reuse for the onnxruntime-genai engine: prompts' keys and values kept by their tokens.

Once a prompt is in (ortgenai_batch.py), its keys and values, a block exactly as long as the
prompt, are parked here, keyed by its tokens. A new request whose prompt starts with some of them
copies that part into its own block and computes only the rest: a shared system prompt, few-shot
examples, or a chat's previous turns. Parked at once, not when the request ends, so requests
running together on one system prompt share it. Entries are read, never handed out: many
requests copy from one.

Bounds: an entry costs its tokens' bytes (ortgenai_kv.KVModel.token_bytes); entries are evicted
least recently used first (a hit makes an entry recent) to stay within the byte budget, and an
entry whose tokens another entry starts with is dropped (the longer one serves all it did).

Same greedy text with or without a hit: onnxruntime's CPU kernels give bit-identical keys, values
and logits for a prompt fed in pieces of any length >= 2 (measured: whole, chunks of 2, 3, 7, 16,
a tail of 2 or 3), but not for a piece of ONE token, which takes other MatMulNBits kernels. So a
hit leaves at least TAIL tokens of the new prompt to run, and only prompt tokens are kept.

Counters follow vLLM's `prefix_cache_queries` / `prefix_cache_hits`: prompt tokens looked up, and
those found. Pure Python (blocks are opaque here): tested without a model.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

TAIL = 2  # prompt tokens a hit still runs: never one alone (see the module docstring)


@dataclass
class CachedPrefix:
    kv: Any  # the keys and values of `tokens` (ortgenai_kv.KVBlock, one row)
    tokens: list[int]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    """Prompts' keys and values by their tokens, LRU within a byte budget. Owner thread only."""

    def __init__(self, budget_bytes: int, bytes_per_token: int) -> None:
        self.budget_bytes = budget_bytes
        self._per_token = bytes_per_token
        self._entries: OrderedDict[int, CachedPrefix] = OrderedDict()  # oldest first
        self._next_key = 0
        self.used_bytes = 0
        self.queries = 0  # prompt tokens looked up (vLLM: prefix_cache_queries)
        self.hits = 0  # of those, tokens found computed (vLLM: prefix_cache_hits)

    def __len__(self) -> int:
        return len(self._entries)

    def cost(self, entry: CachedPrefix) -> int:
        return len(entry.tokens) * self._per_token

    def lookup(self, prompt: list[int]) -> tuple[CachedPrefix | None, int]:
        """The entry sharing the longest prefix with `prompt` (now the most recent), and how
        many prompt tokens it saves: at most len(prompt) - TAIL, so that what runs is computed
        exactly as without the cache."""
        self.queries += len(prompt)
        best_key, best = None, 0
        for key, entry in self._entries.items():
            shared = min(common_prefix(entry.tokens, prompt), len(prompt) - TAIL)
            if shared > best:
                best_key, best = key, shared
        if best_key is None:
            return None, 0
        self._entries.move_to_end(best_key)
        self.hits += best
        return self._entries[best_key], best

    def put(self, entry: CachedPrefix) -> None:
        """Park a prompt's keys and values as the most recent; evict the oldest beyond the
        budget, and any entry whose tokens the new one starts with."""
        cost = self.cost(entry)
        if cost > self.budget_bytes or not entry.tokens:
            return
        for key, held in list(self._entries.items()):
            if entry.tokens[: len(held.tokens)] == held.tokens:
                del self._entries[key]
                self.used_bytes -= self.cost(held)
        self._entries[self._next_key] = entry
        self._next_key += 1
        self.used_bytes += cost
        while self.used_bytes > self.budget_bytes:
            _, oldest = self._entries.popitem(last=False)
            self.used_bytes -= self.cost(oldest)

    def clear(self) -> None:
        self._entries.clear()
        self.used_bytes = 0
