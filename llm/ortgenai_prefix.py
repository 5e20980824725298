"""Prefix reuse for the onnxruntime-genai engine: prompts' keys and values kept by their tokens.

Once a prompt is in (ortgenai_batch.py), its keys and values, a block exactly as long as the
prompt, are parked here, keyed by its tokens. A new request whose prompt starts with some of them
copies that part into its own block and computes only the rest: a shared system prompt, few-shot
examples, or a chat's previous turns. Parked at once, not when the request ends, so requests
running together on one system prompt share it. Entries are read, never handed out: many
requests copy from one.

Tenancy: reuse is a side channel. A hit shows in `usage.prompt_tokens_details.cached_tokens` and
in the time to the first token, so whoever can hit another client's entries can test guesses at
that client's prompt, token by token. Every entry therefore lives under a scope, (model, salt),
and a lookup only ever sees its own scope's entries: the salt plays the part vLLM's `cache_salt`
plays in its block hashes (mixed into the first block's hash, so only requests with the same salt
share anything). The serving layer builds the salt from the API key's name and the request's
`cache_salt` (server/tenancy.py): requests under different keys, or with different salts, never
share a prefix, and `cached_tokens` counts only the requester's own. Requests with no key and no
salt share one scope, as in vLLM.

Structure: one token trie per scope; each node knows the entries whose tokens pass through it, so
a lookup walks the prompt once, O(prompt length) whatever the number of entries, and a put or an
eviction walks the entry's tokens once.

Bounds: ONE byte budget for every model of the process (`PrefixCache` is shared, behind a lock:
each engine's owner thread uses it). An entry costs its tokens' keys and values
(ortgenai_kv.KVModel.token_bytes) plus NODE_BYTES of trie per token; entries are evicted least
recently used first, across models (a hit makes an entry recent), to stay within the budget, and
an entry whose tokens another entry of its scope starts with is dropped (the longer one serves all
it did).

Same greedy text with or without a hit: onnxruntime's CPU kernels give bit-identical keys, values
and logits for a prompt fed in pieces of any length >= 2 (measured: whole, chunks of 2, 3, 7, 16,
a tail of 2 or 3), but not for a piece of ONE token, which takes other MatMulNBits kernels. So a
hit leaves at least TAIL tokens of the new prompt to run, and only prompt tokens are kept; except
a prompt sent again whole (a retry, `n` choices, an evaluation rerun): an entry keeps its last
position's logits too, so such a prompt runs nothing and its first token comes from the very
logits its first run gave (vLLM and llama-server run its last token again).

Counters follow vLLM's `prefix_cache_queries` / `prefix_cache_hits` (per model, `ModelPrefixCache`):
prompt tokens looked up, and those found. Pure Python (blocks are opaque here): tested without a
model.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

TAIL = 2  # prompt tokens a hit still runs: never one alone (see the module docstring)
NODE_BYTES = 600  # a trie node's Python objects, about: counted against the budget per token


@dataclass
class CachedPrefix:
    kv: Any  # the keys and values of `tokens` (ortgenai_kv.KVBlock, one row)
    tokens: list[int]
    scope: Hashable = None  # (model, salt): only lookups of the same scope see it
    nbytes: int = 0  # what it holds of the budget
    logits: Any = None  # its last position's (read, never written): a whole repeat runs nothing


class _Node:
    __slots__ = ("children", "ends", "holders")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.holders: set[int] = set()  # entries whose tokens pass through here
        self.ends: set[int] | None = None  # entries whose tokens end here


class PrefixCache:
    """Prompts' keys and values by scope and tokens, LRU within one byte budget. Thread-safe:
    the owner threads of every engine in the process share one."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._roots: dict[Hashable, _Node] = {}
        self._entries: OrderedDict[int, CachedPrefix] = OrderedDict()  # oldest first
        self._next_key = 0
        self.used_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(
        self, scope: Hashable, prompt: list[int], whole: bool = True
    ) -> tuple[CachedPrefix | None, int]:
        """The entry of `scope` sharing the longest prefix with `prompt` (now the most recent),
        and how many prompt tokens it saves: all of them where an entry is `prompt` itself with
        its last logits (and `whole`), else at most len(prompt) - TAIL, so that what runs is
        computed exactly as without the cache. One walk down the prompt."""
        with self._lock:
            node = self._roots.get(scope)
            depth = 0
            while node is not None and depth < len(prompt):
                child = node.children.get(prompt[depth])
                if child is None:
                    break
                node, depth = child, depth + 1
            if node is None:
                return None, 0
            if whole and depth == len(prompt):
                kept = next(
                    (k for k in node.ends or () if self._entries[k].logits is not None), None
                )
                if kept is not None:
                    self._entries.move_to_end(kept)
                    return self._entries[kept], depth
            depth = min(depth, len(prompt) - TAIL)
            if depth <= 0:
                return None, 0
            # Every entry through the node reached also holds the prompt's first `depth` tokens.
            key = next(iter(node.holders))
            self._entries.move_to_end(key)
            return self._entries[key], depth

    def put(self, entry: CachedPrefix) -> None:
        """Park a prompt's keys and values as the most recent; evict the oldest beyond the
        budget, and any entry of its scope whose tokens the new one starts with."""
        if entry.nbytes > self.budget_bytes or not entry.tokens:
            return
        with self._lock:
            key = self._next_key
            self._next_key += 1
            node = self._roots.setdefault(entry.scope, _Node())
            covered: list[int] = []
            for token in entry.tokens:
                node = node.children.setdefault(token, _Node())
                if node.ends:
                    covered.extend(node.ends)
                node.holders.add(key)
            node.ends = node.ends or set()
            node.ends.add(key)
            self._entries[key] = entry
            self.used_bytes += entry.nbytes
            for old in covered:
                self._remove(old)
            while self.used_bytes > self.budget_bytes:
                self._remove(next(iter(self._entries)))

    def drop_scopes(self, model: str) -> None:
        """Forget every entry of `model` (scopes are (model, salt)): its engine is closing."""
        with self._lock:
            for key, entry in list(self._entries.items()):
                if isinstance(entry.scope, tuple) and entry.scope[:1] == (model,):
                    self._remove(key)

    def _remove(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.used_bytes -= entry.nbytes
        root = self._roots[entry.scope]
        path = [root]
        for token in entry.tokens:
            path.append(path[-1].children[token])
        ends = path[-1].ends
        assert ends is not None
        ends.discard(key)
        for depth in range(len(entry.tokens), 0, -1):
            node = path[depth]
            node.holders.discard(key)
            if not node.holders:  # nobody passes here any more: prune the branch
                del path[depth - 1].children[entry.tokens[depth - 1]]
        if not root.children:
            del self._roots[entry.scope]


class ModelPrefixCache:
    """One model's view of the shared PrefixCache: its scopes and its counters. Owner thread."""

    def __init__(self, store: PrefixCache, model: str, token_bytes: int) -> None:
        self.store = store
        self._model = model
        self._per_token = token_bytes + NODE_BYTES
        self.queries = 0  # prompt tokens looked up (vLLM: prefix_cache_queries)
        self.hits = 0  # of those, tokens found computed (vLLM: prefix_cache_hits)

    def lookup(
        self, salt: str | None, prompt: list[int], whole: bool = True
    ) -> tuple[CachedPrefix | None, int]:
        self.queries += len(prompt)
        entry, reused = self.store.lookup((self._model, salt), prompt, whole)
        self.hits += reused
        return entry, reused

    def put(self, salt: str | None, tokens: list[int], kv: Any, logits: Any = None) -> None:
        """Park `tokens`' keys and values, and the logits of their last position if given."""
        nbytes = len(tokens) * self._per_token + getattr(logits, "nbytes", 0)
        self.store.put(CachedPrefix(kv, tokens, (self._model, salt), nbytes, logits))

    def clear(self) -> None:
        self.store.drop_scopes(self._model)
