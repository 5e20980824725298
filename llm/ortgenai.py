"""onnxruntime-genai engine: one owner thread drives the runtime; asyncio callers get deltas.

onnxruntime-genai objects are used only from the thread that created them, so every call into
it happens on one dedicated thread (ortgenai_owner.py) fed by a `queue.Queue` of commands. Deltas
go back to the event loop with `loop.call_soon_threadsafe` into one asyncio queue per request.

Scheduling: the running requests decode together, one onnxruntime forward pass per turn
(ortgenai_batch.py over ortgenai_kv.py), a new request's prompt starts on the next turn (up to
`max_running`), and every prompt's keys and values are kept for the next prompt that shares its
prefix (ortgenai_prefix.py). A grammar masks its own row there (grammar_rows.py). Requests
only an og.Generator serves (adapters) run on batch-1 generators stepped in turn
(ortgenai_lora.py). `spec_tokens` > 0: n-gram speculation for a request decoding alone
(ortgenai_batch.py, ngram_draft.py). `deterministic`: greedy text
independent of load, at a one-stream cost (ortgenai_batch.py). Stop strings are matched by Ferry
(stops.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, Unpack

from ferry.llm.adapters import AdapterTable
from ferry.llm.base import (
    EngineStats,
    GenerateOptions,
    GenerationDelta,
    SamplingSettings,
    check_admission,
    generate_options,
    merge_deltas,
)
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.errors import EngineDead, adapter_refused
from ferry.llm.ortgenai_kv import KVModel
from ferry.llm.ortgenai_lora import adapter_key, adapter_name
from ferry.llm.ortgenai_owner import (
    STOP,
    AbortRequest,
    AddRequest,
    EngineOptions,
    OwnerCall,
    OwnerLoop,
)
from ferry.llm.ortgenai_prefix import PrefixCache
from ferry.llm.sliding_window import check_sliding_window

log = logging.getLogger(__name__)


class OrtGenAIEngine:
    """An LLMEngine over onnxruntime-genai's Engine API (see the module docstring)."""

    # og 0.18's search has a repetition penalty (TurnOptions and GeneratorParams alike), but no
    # presence or frequency penalty and no logit bias: those are refused with a 400. vLLM's
    # extensions are Ferry's own masks and matching (sampling.py, stops.py, detokenize.py).
    sampling_options = frozenset(
        {
            "repetition_penalty",
            "top_k",
            "min_p",
            "min_tokens",
            "ignore_eos",
            "stop_token_ids",
            "include_stop_str_in_output",
            "skip_special_tokens",
        }
    )

    def __init__(
        self,
        model_dir: str | Path,
        *,
        name: str = "tiny-llm",
        max_running: int | None = None,
        max_waiting: int = 64,
        prefix_cache: bool = True,
        prefix_cache_bytes: int = EngineOptions.prefix_cache_bytes,
        prefix_store: PrefixCache | None = None,
        prefill_chunk: int = EngineOptions.prefill_chunk,
        deterministic: bool = False,
        spin_us: int = 0,
        spec_tokens: int = 0,
        adapters: Mapping[str, Path] | None = None,
        max_adapters: int = 4,
        special_tokens_in_content: bool = False,
    ) -> None:
        self.name = name
        self._model_dir = Path(model_dir)
        # The prompt side runs on the event loop with the tokenizers library, never through og.
        self.tokenizer = ChatTokenizer(
            self._model_dir, escape_special_tokens=not special_tokens_in_content
        )
        genai_config = json.loads((self._model_dir / "genai_config.json").read_text())
        check_sliding_window(genai_config)  # refused at start, not a 500 on every request
        self.max_context_tokens: int = int(genai_config["model"]["context_length"])
        self._options = EngineOptions(
            max_running=max_running or EngineOptions.max_running,
            prefix_cache=prefix_cache,
            prefix_cache_bytes=prefix_cache_bytes,
            prefix_store=prefix_store,
            prefill_chunk=prefill_chunk,
            deterministic=deterministic,
            spin_us=spin_us,
            spec_tokens=spec_tokens,
        )
        eos = genai_config["model"].get("eos_token_id", [])
        self._eos_ids = set(eos) if isinstance(eos, list) else {eos}
        self._initial_adapters = dict(adapters or {})
        self._adapters = AdapterTable(max_adapters)
        self._calls: set[asyncio.Future[None]] = set()  # owner-thread calls awaiting an answer
        self._max_running = self._options.max_running
        self._max_waiting = max_waiting
        self._commands: queue.Queue[object] = queue.Queue()
        self._streams: dict[str, asyncio.Queue[GenerationDelta | Exception]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._closing = False
        # Written by the owner thread only; plain ints are safe to read anywhere.
        self._running = 0
        self._waiting = 0
        self._cache_counts = (0, 0)  # prefix cache (queries, hits) in tokens
        self._outbox: list[tuple[str, GenerationDelta | Exception]] = []  # owner thread only
        self._owner: OwnerLoop | None = None  # while the owner thread runs (read by stats)

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        started: asyncio.Future[int] = self._loop.create_future()
        self._thread = threading.Thread(
            target=self._owner_main, args=(started,), name=f"ortgenai-{self.name}", daemon=True
        )
        self._thread.start()
        max_running = await started
        for adapter, path in self._initial_adapters.items():
            await self.load_adapter(adapter, path)
        log.info("ortgenai engine %s ready (max_running=%d)", self.name, max_running)

    async def close(self) -> None:
        self._closing = True
        if self._thread is not None and self._thread.is_alive():
            self._commands.put(STOP)
            await asyncio.to_thread(self._thread.join, 30)
        self._fail_all(EngineDead(f"engine {self.name} is closed"))

    def is_ready(self) -> bool:
        alive = self._thread is not None and self._thread.is_alive()
        return alive and self._failure is None and not self._closing

    def stats(self) -> EngineStats:
        queries, hits = self._cache_counts
        owner = self._owner
        positions, waiting_keys = (0, []) if owner is None else owner.held()
        drafted, accepted = (0, 0) if owner is None else owner.speculated()
        return EngineStats(
            self._running,
            self._waiting,
            queries,
            hits,
            # Every admitted sequence may grow to a full context: that is the engine's KV room.
            kv_cache_usage=positions / (self._max_running * self.max_context_tokens),
            running_lora_adapters=tuple(self._adapters.names()),
            waiting_lora_adapters=tuple(
                sorted({adapter_name(key) for key in waiting_keys if key is not None})
            ),
            spec_draft_tokens=drafted,
            spec_accepted_tokens=accepted,
        )

    # -- requests (event-loop thread) -------------------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingSettings,
        **options: Unpack[GenerateOptions],
    ) -> AsyncIterator[GenerationDelta]:
        """`priority`: waiting requests start lowest first (vLLM's priority scheduling);
        `cache_salt`: prefix reuse only with requests of the same salt (ortgenai_prefix.py)."""
        adapter, priority, cache_salt = generate_options(options)
        held, ready = len(self._streams), self.is_ready()
        check_admission(self.name, ready, held, self._capacity, self._failure)
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        key = None
        if adapter is not None:  # held until the request ends, so an unload waits for it
            adapter_id = self._adapters.acquire(adapter)
            key = adapter_key(adapter, adapter_id)
        stream: asyncio.Queue[GenerationDelta | Exception] = asyncio.Queue()
        self._streams[request_id] = stream
        self._commands.put(AddRequest(request_id, prompt_ids, sampling, key, priority, cache_salt))
        finished = False
        try:
            while not finished:
                item = await stream.get()
                if isinstance(item, Exception):
                    finished = True
                    raise item
                # When the consumer fell behind, hand over everything already decoded as one
                # delta: fewer hops per token is what keeps many streams fast.
                while item.finish_reason is None and not stream.empty():
                    following = stream.get_nowait()
                    if isinstance(following, Exception):
                        stream.put_nowait(following)  # raised on the next turn
                        break
                    item = merge_deltas(item, following)
                finished = item.finish_reason is not None
                yield item
        finally:
            self._streams.pop(request_id, None)
            if not finished:  # the consumer left early: stop spending compute on it
                self._commands.put(AbortRequest(request_id))
            if key is not None:
                self._adapters.release(adapter_id)

    # -- adapters (event-loop thread) -------------------------------------------------------------

    def adapter_names(self) -> list[str]:
        return self._adapters.names()

    async def load_adapter(self, name: str, path: Path) -> None:
        adapter_id = self._adapters.reserve(name)
        key = adapter_key(name, adapter_id)
        try:
            await self._call(lambda owner: owner.generator_lane().load(key, path))
        except EngineDead:
            self._adapters.cancel(name)
            raise
        except Exception as exc:
            self._adapters.cancel(name)
            raise adapter_refused(name, path, exc) from None
        self._adapters.commit(name, adapter_id)

    async def unload_adapter(self, name: str) -> None:
        """New requests on `name` fail at once; its weights go once its requests finished."""
        key = adapter_key(name, await self._adapters.retire(name))
        await self._call(lambda owner: owner.generator_lane().unload(key))

    async def _call(self, action: Callable[[OwnerLoop], None]) -> None:
        if not self.is_ready():
            raise EngineDead(f"engine {self.name} is not running") from self._failure
        assert self._loop is not None
        future: asyncio.Future[None] = self._loop.create_future()
        self._calls.add(future)

        loop = self._loop

        def done(error: BaseException | None) -> None:  # owner thread
            if error is None:
                loop.call_soon_threadsafe(_set_result, future, None)
            else:
                loop.call_soon_threadsafe(_set_exception, future, error)

        self._commands.put(OwnerCall(action, done))
        try:
            await future
        finally:
            self._calls.discard(future)

    @property
    def deterministic(self) -> bool:
        """Greedy text independent of load (ortgenai_batch.py), at a one-stream cost."""
        return self._options.deterministic

    @property
    def spin_us(self) -> int:
        """How long the decoder's pool threads spin between ops before they sleep."""
        return self._options.spin_us

    @property
    def spec_tokens(self) -> int:
        """Drafted tokens a speculative step checks at most; 0: no speculation."""
        return self._options.spec_tokens

    @property
    def max_concurrent_generations(self) -> int:
        return self._capacity

    @property
    def _capacity(self) -> int:
        return self._max_running + self._max_waiting

    def _deliver(self, request_id: str, item: GenerationDelta | Exception) -> None:
        """Owner thread: queue an item for the event loop; `_flush` sends them."""
        self._outbox.append((request_id, item))

    def _flush(self) -> None:
        """Owner thread -> event loop, once per engine step for every stream: one loop wake-up
        instead of one per token per stream. A stream that is gone (aborted) drops its items."""
        if not self._outbox:
            return
        batch, self._outbox = self._outbox, []

        def put_all() -> None:
            for request_id, item in batch:
                stream = self._streams.get(request_id)
                if stream is not None:
                    stream.put_nowait(item)

        assert self._loop is not None
        self._loop.call_soon_threadsafe(put_all)

    def _fail_all(self, error: Exception) -> None:
        for stream in self._streams.values():
            stream.put_nowait(error)
        for future in list(self._calls):
            _set_exception(future, error)

    # -- owner thread -----------------------------------------------------------------------------

    def _owner_main(self, started: asyncio.Future[int]) -> None:
        loop = self._loop
        assert loop is not None
        try:
            import onnxruntime_genai as og

            worker = OwnerLoop(
                og,
                self.name,
                KVModel(self._model_dir, spin_us=self._options.spin_us),
                self.tokenizer.tokenizer,
                self._options,
                self._eos_ids,
                self._deliver,
                self._set_counts,
                self._flush,
            )
        except BaseException as exc:
            self._failure = exc
            loop.call_soon_threadsafe(_set_exception, started, EngineDead(f"load failed: {exc}"))
            return
        loop.call_soon_threadsafe(_set_result, started, worker.max_running)
        self._owner = worker
        try:
            worker.serve(self._commands)
        except BaseException as exc:
            log.exception("ortgenai engine %s died", self.name)
            self._failure = exc  # set before the loop callback so generate() sees it first
            dead = EngineDead(f"engine {self.name} died: {exc}")
            loop.call_soon_threadsafe(self._fail_all, dead)
        finally:
            self._flush()
            self._owner = None
            worker.release()  # og objects are freed on the thread that owns them
            self._set_counts(0, 0)

    def _set_counts(self, running: int, waiting: int, cache: tuple[int, int] = (0, 0)) -> None:
        self._running, self._waiting = running, waiting
        if cache != (0, 0):
            self._cache_counts = cache


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
