"""Grammars, one llguidance matcher per constrained request, on both of the engine's lanes.

Each constrained request gets an `LLMatcher` on the model's vocabulary; before each token its
logits are masked to what the grammar allows, and the token chosen is consumed. This is what
onnxruntime-genai's guidance does inside an og.Generator (its GuidanceLogitsProcessor: the
tokenizer.json vocabulary at the config's `vocab_size`, a mask of allowed ids, only the first
end-of-sequence id once the grammar stopped), done here in numpy: on the batch lane
(ortgenai_batch.py) a constrained row decodes in the same forward pass as the free ones; on the
generator lane (ortgenai_lora.py: adapters) the masked logits go back with `set_logits`.

Compiling: `LLMatcher(...)` releases the GIL while it builds the grammar, so it runs on a small
thread pool while the request's prompt goes in: the event loop never waits for it, and the owner
thread (its other rows) only when it outlasts the prompt. og's own guidance compiled inside
og.Generator's creation with the GIL held: ~100 ms of frozen event loop for a large schema. The
vocabulary (`LLTokenizer`) is built once per model, when the engine starts: it holds the GIL
(~0.4 s for SmolLM2's 49k tokens). A compiled grammar is kept (LRU) and copied for each request
that sends it again: ~0.3 ms instead of a compile of up to ~100 ms.
Errors read as onnxruntime-genai words them ("Error creating grammar", "Error computing mask",
"Error committing tokens"), so `guidance.request_error` makes them the same 400 as before.
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ferry.llm.base import Guidance

_COMPILERS = 2  # threads compiling grammars; each compile releases the GIL
# Compiled grammars kept per model: agents send the same tools or schema on every call.
_CACHED = 64


class RowGrammar:
    """One request's matcher: the mask of allowed tokens before each step, the token after."""

    def __init__(self, matcher: Any, vocab_size: int, eos: int) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._eos = eos
        self._bits = np.zeros((vocab_size + 31) // 32, np.int32)

    def allowed(self, width: int) -> np.ndarray:
        """Which of `width` logits the grammar allows next (bool); a model vocabulary wider than
        the tokenizer's has its extra ids disallowed. Only the end of sequence once stopped."""
        matcher = self._matcher
        allowed = np.zeros(width, bool)
        if matcher.is_error():
            raise RuntimeError(f"Error computing mask: {matcher.get_error()}")
        if matcher.is_stopped():
            allowed[self._eos] = True
            return allowed
        # Writes the mask in place with the GIL released.
        matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if matcher.is_error():
            raise RuntimeError(f"Error computing mask: {matcher.get_error()}")
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")
        shared = min(width, self._vocab_size)
        allowed[:shared] = bits[:shared]
        return allowed

    def masked(self, logits: np.ndarray) -> np.ndarray:
        """float32 `logits` (any leading shape) with what the grammar disallows at float32's
        lowest, as og's guidance writes them, for an og.Generator's `set_logits`."""
        allowed = self.allowed(logits.shape[-1])
        return np.where(allowed, logits, np.finfo(np.float32).min).astype(np.float32)

    def consume(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise RuntimeError(f"Error committing tokens: {self._matcher.get_error()}")


class GrammarCompiler:
    """Matchers for one model's vocabulary, compiled on a small thread pool."""

    def __init__(self, model_dir: Path) -> None:
        config = json.loads((model_dir / "genai_config.json").read_text())["model"]
        eos = config.get("eos_token_id", [])
        eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos])]
        self._vocab_size = int(config["vocab_size"])
        self._eos = eos_ids[0]  # og forces the first one once a grammar stopped
        path = str(model_dir / "tokenizer.json")
        self._tokenizer = _vocabulary(path, self._vocab_size, tuple(eos_ids))
        self._pool = ThreadPoolExecutor(_COMPILERS, thread_name_prefix="ferry-grammar")
        self._lock = threading.Lock()  # the pool's threads share the kept grammars
        self._compiled: OrderedDict[tuple[str, str], Any] = OrderedDict()  # LRU

    def compile(self, guidance: Guidance) -> Future[RowGrammar]:
        return self._pool.submit(self._compile, guidance)

    @property
    def cached(self) -> int:
        """Compiled grammars kept for the next request that sends the same one."""
        return len(self._compiled)

    def _compile(self, guidance: Guidance) -> RowGrammar:
        key = (guidance.kind, guidance.data)
        with self._lock:
            pristine = self._compiled.get(key)
            if pristine is not None:
                self._compiled.move_to_end(key)
        if pristine is None:
            pristine = self._new_matcher(guidance)
            with self._lock:
                self._compiled[key] = pristine
                while len(self._compiled) > _CACHED:
                    self._compiled.popitem(last=False)
        # A copy per request (well under a millisecond): the kept one never consumes a token.
        return RowGrammar(pristine.deep_copy(), self._vocab_size, self._eos)

    def _new_matcher(self, guidance: Guidance) -> Any:
        from llguidance import LLMatcher

        try:
            grammar = _grammar(guidance)
        except ValueError as exc:  # not JSON: the serving layer checked it, but say so
            raise RuntimeError(f"Error creating grammar: {exc}") from None
        matcher = LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise RuntimeError(f"Error creating grammar: {matcher.get_error()}")
        return matcher

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _grammar(guidance: Guidance) -> str:
    from llguidance import LLMatcher

    if guidance.kind == "json_schema":
        return str(LLMatcher.grammar_from_json_schema(guidance.data))
    if guidance.kind == "regex":
        return str(LLMatcher.grammar_from_regex(guidance.data))
    return str(LLMatcher.grammar_from_lark(guidance.data))


@functools.cache
def _vocabulary(path: str, vocab_size: int, eos_ids: tuple[int, ...]) -> Any:
    """One per model: the engine's lanes and tests share it (it is read-only)."""
    from llguidance import LLTokenizer

    return LLTokenizer(path, n_vocab=vocab_size, eos_token=list(eos_ids))
