"""onnxruntime-genai engine: one owner thread drives `og.Engine`; asyncio callers get deltas.

onnxruntime-genai's Engine must be used only from the thread that created it, so every call into
it happens on one dedicated thread fed by a `queue.Queue` of commands (add, abort, stop). Deltas
go back to the event loop with `loop.call_soon_threadsafe` into one asyncio queue per request.

Batching: on CPU (and any model built without paged attention) og.Engine uses its *static* batch
path: up to `configured_max_batch_size` requests run together and a finished request leaves at
once, but new requests join only when the whole batch has drained. A model built with
`use_paged_attention` (CUDA, fp16/bf16) gets true continuous batching with the same code.
Stop strings are matched here, since og.Engine supports them only on the dynamic path.
Requests on a LoRA adapter run beside the engine on generators of their own (ortgenai_lora.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ferry.llm.adapters import AdapterTable
from ferry.llm.base import (
    EngineStats,
    FinishReason,
    GenerationDelta,
    SamplingSettings,
    TokenLogprob,
    merge_deltas,
)
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.errors import EngineDead, EngineOverloaded, GenerationFailed, InvalidAdapter
from ferry.llm.ortgenai_lora import GeneratorLane, adapter_key
from ferry.llm.stops import StopMatcher

log = logging.getLogger(__name__)

_EVENT_BUFFER = 64
_IDLE_POLL_S = 0.05  # only when og reports no pending work while requests are resident
_STOP = object()


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingSettings  # max_tokens already fits the context
    adapter: str | None = None  # the runtime's adapter key; None: the base model


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Call:
    """Run `action` on the owner thread (adapter loads and unloads); `done` gets its outcome."""

    action: Callable[[_OwnerLoop], None]
    done: Callable[[BaseException | None], None]


@dataclass
class _Job:
    """One request as the owner thread sees it."""

    add: _Add
    matcher: StopMatcher
    og_request: Any = None  # on the engine
    generator: Any = None  # on the adapter lane
    decoder: Any = None
    generated: int = field(default=0)
    logprob: TokenLogprob | None = None  # the last token's, when sampling.logprobs is set
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # until delivered (echo)


class OrtGenAIEngine:
    """An LLMEngine over onnxruntime-genai's Engine API (see the module docstring)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        name: str = "tiny-llm",
        max_running: int | None = None,
        max_waiting: int = 64,
        adapters: Mapping[str, Path] | None = None,
        max_adapters: int = 4,
    ) -> None:
        self.name = name
        self._model_dir = Path(model_dir)
        # The prompt side runs on the event loop with the tokenizers library, never through og.
        self.tokenizer = ChatTokenizer(self._model_dir)
        genai_config = json.loads((self._model_dir / "genai_config.json").read_text())
        self.max_context_tokens: int = int(genai_config["model"]["context_length"])
        self._engine_config: dict[str, Any] = genai_config.get("engine", {})
        eos = genai_config["model"].get("eos_token_id", [])
        self._eos_ids = set(eos) if isinstance(eos, list) else {eos}
        self._initial_adapters = dict(adapters or {})
        self._adapters = AdapterTable(max_adapters)
        self._calls: set[asyncio.Future[None]] = set()  # owner-thread calls awaiting an answer
        self._max_running = max_running  # None: the runtime's own batch size, read at start
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
        self._outbox: list[tuple[str, GenerationDelta | Exception]] = []  # owner thread only

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
            self._commands.put(_STOP)
            await asyncio.to_thread(self._thread.join, 30)
        self._fail_all(EngineDead(f"engine {self.name} is closed"))

    def is_ready(self) -> bool:
        alive = self._thread is not None and self._thread.is_alive()
        return alive and self._failure is None and not self._closing

    def stats(self) -> EngineStats:
        return EngineStats(running=self._running, waiting=self._waiting)

    # -- requests (event-loop thread) -------------------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingSettings,
        adapter: str | None = None,
    ) -> AsyncIterator[GenerationDelta]:
        if not self.is_ready():
            raise EngineDead(f"engine {self.name} is not running") from self._failure
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        if len(self._streams) >= self._capacity:
            raise EngineOverloaded(f"engine {self.name} has {len(self._streams)} requests")
        key = None
        if adapter is not None:  # held until the request ends, so an unload waits for it
            adapter_id = self._adapters.acquire(adapter)
            key = adapter_key(adapter, adapter_id)
        stream: asyncio.Queue[GenerationDelta | Exception] = asyncio.Queue()
        self._streams[request_id] = stream
        self._commands.put(_Add(request_id, prompt_ids, sampling, key))
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
                self._commands.put(_Abort(request_id))
            if key is not None:
                self._adapters.release(adapter_id)

    # -- adapters (event-loop thread) -------------------------------------------------------------

    def adapter_names(self) -> list[str]:
        return self._adapters.names()

    async def load_adapter(self, name: str, path: Path) -> None:
        adapter_id = self._adapters.reserve(name)
        key = adapter_key(name, adapter_id)
        try:
            await self._call(lambda owner: owner.lane.load(key, path))
        except EngineDead:
            self._adapters.cancel(name)
            raise
        except Exception as exc:
            self._adapters.cancel(name)
            raise InvalidAdapter("lora_path", f"cannot load adapter {path}: {exc}") from None
        self._adapters.commit(name, adapter_id)

    async def unload_adapter(self, name: str) -> None:
        """New requests on `name` fail at once; its weights go once its requests finished."""
        key = adapter_key(name, await self._adapters.retire(name))
        await self._call(lambda owner: owner.lane.unload(key))

    async def _call(self, action: Callable[[_OwnerLoop], None]) -> None:
        if not self.is_ready():
            raise EngineDead(f"engine {self.name} is not running") from self._failure
        assert self._loop is not None
        future: asyncio.Future[None] = self._loop.create_future()
        self._calls.add(future)

        def done(error: BaseException | None) -> None:  # owner thread
            settle = _set_result if error is None else _set_exception
            self._loop.call_soon_threadsafe(settle, future, error)  # type: ignore[union-attr]

        self._commands.put(_Call(action, done))
        try:
            await future
        finally:
            self._calls.discard(future)

    @property
    def _capacity(self) -> int:
        return (self._max_running or 0) + self._max_waiting

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

            model = og.Model(str(self._model_dir))
            worker = _OwnerLoop(
                og,
                model,
                self._engine_config,
                self._max_running,
                self._eos_ids,
                self._deliver,
                self._set_counts,
                self._flush,
            )
            self._max_running = worker.max_running
        except BaseException as exc:
            self._failure = exc
            loop.call_soon_threadsafe(_set_exception, started, EngineDead(f"load failed: {exc}"))
            return
        loop.call_soon_threadsafe(_set_result, started, worker.max_running)
        try:
            worker.serve(self._commands)
        except BaseException as exc:
            log.exception("ortgenai engine %s died", self.name)
            self._failure = exc  # set before the loop callback so generate() sees it first
            dead = EngineDead(f"engine {self.name} died: {exc}")
            loop.call_soon_threadsafe(self._fail_all, dead)
        finally:
            self._flush()
            worker.release()  # og objects are freed on the thread that owns them
            self._set_counts(0, 0)

    def _set_counts(self, running: int, waiting: int) -> None:
        self._running, self._waiting = running, waiting


class _OwnerLoop:
    """Everything that touches og.Engine. Lives and dies on the owner thread."""

    def __init__(
        self,
        og: Any,
        model: Any,
        dynamic_config: dict[str, Any],
        max_running: int | None,
        eos_ids: set[int],
        deliver: Callable[[str, GenerationDelta | Exception], None],
        set_counts: Callable[[int, int], None],
        flush: Callable[[], None],
    ) -> None:
        self._og = og
        self._model = model
        self._tokenizer = og.Tokenizer(model)
        self._engine = og.Engine(model)
        self._buffer = self._engine.create_event_buffer(_EVENT_BUFFER)
        capacity = self._engine.get_capabilities().configured_max_batch_size
        self.max_running = max_running or capacity or 4
        self.lane = GeneratorLane(og, model, self.max_running, eos_ids)
        self._dynamic = "dynamic_batching" in dynamic_config
        self._deliver = deliver
        self._set_counts = set_counts
        self._flush = flush
        self._waiting: deque[_Job] = deque()
        self._running: dict[Any, _Job] = {}  # og.Request -> job; events name the og.Request
        self._by_id: dict[str, _Job] = {}

    def serve(self, commands: queue.Queue[object]) -> None:
        while True:
            self._flush()  # before any blocking wait: nothing decoded may sit in the outbox
            idle = not self._running and not self._waiting and not self.lane.jobs
            if not self._drain(commands, block=idle):
                return
            self._admit()
            only_resident = self._running and not self.lane.jobs
            if self._engine.has_pending_requests():
                self._step()
            elif only_resident and not self._drain(commands, block=True, timeout=_IDLE_POLL_S):
                return  # (resident but nothing to run: wait for a command rather than spin)
            if self.lane.jobs:  # adapter requests take their turn after every engine step
                self._step_lane()

    def _drain(
        self, commands: queue.Queue[object], block: bool, timeout: float | None = None
    ) -> bool:
        """Apply queued commands; False once told to stop."""
        try:
            command = commands.get(block=block, timeout=timeout)
        except queue.Empty:
            return True
        while True:
            if command is _STOP:
                return False
            if isinstance(command, _Add):
                job = _Job(command, StopMatcher(command.sampling.stop))
                self._by_id[command.request_id] = job
                self._waiting.append(job)
            elif isinstance(command, _Abort):
                self._abort(command.request_id)
            elif isinstance(command, _Call):
                self._run_call(command)
            try:
                command = commands.get_nowait()
            except queue.Empty:
                self._publish_counts()
                return True

    def _admit(self) -> None:
        blocked: deque[_Job] = deque()  # their lane is full; the other lane may still admit
        while self._waiting:
            job = self._waiting.popleft()
            add = job.add
            on_lane = add.adapter is not None or _needs_logits(add.sampling)
            if not (self.lane.has_room() if on_lane else len(self._running) < self.max_running):
                blocked.append(job)
                continue
            try:
                if on_lane:
                    self.lane.begin(job, add.adapter, add.prompt_ids, add.sampling)
                else:
                    job.og_request = self._begin(add)
                    self._running[job.og_request] = job
            except Exception as exc:  # a bad request must not kill the engine
                self._by_id.pop(add.request_id, None)
                self._deliver(add.request_id, GenerationFailed(str(exc)))
                continue
            job.decoder = self._tokenizer.create_stream()
        self._waiting = blocked
        self._publish_counts()

    def _run_call(self, call: _Call) -> None:
        try:
            call.action(self)
        except Exception as exc:  # an adapter that fails to load must not kill the engine
            call.done(exc)
        else:
            call.done(None)

    def _begin(self, add: _Add) -> Any:
        og = self._og
        options = og.RequestOptions()
        sampling = add.sampling
        options.set_max_session_tokens(len(add.prompt_ids) + sampling.max_tokens)
        request = self._engine.create_request(options=options)
        turn = og.TurnOptions(request)
        turn.set_max_generated_tokens(sampling.max_tokens)
        if sampling.greedy:
            turn.set_do_sample(False)
        else:
            turn.set_do_sample(True)
            turn.set_temperature(sampling.temperature)
            turn.set_top_p(sampling.top_p)
            turn.set_top_k(0)  # OpenAI semantics: nucleus only, no implicit top-k from the config
        # og accepts a per-request seed only on the dynamic (paged) path; elsewhere the seed is
        # best-effort ignored, as OpenAI documents seeds to be.
        if sampling.seed is not None and self._dynamic:
            turn.set_seed(sampling.seed)
        request.begin_turn(np.asarray(add.prompt_ids, dtype=np.int32), turn)
        return request

    def _step(self) -> None:
        flags = self._og.EngineEventFlags
        for event in self._engine.run(self._buffer):
            if event.request is None:
                if event.flags & (flags.CAPACITY_BLOCKED | flags.RETRYABLE):
                    continue  # nothing committed; pending work retries on the next step
                raise RuntimeError(f"engine event flags={event.flags} error={event.error_code}")
            job = self._running.get(event.request)
            if job is None:
                continue  # an event for a request aborted in this same step
            if event.flags & flags.FAILED:
                self._finish(job, GenerationFailed(f"generation failed: {event.error_code}"))
                continue
            self._on_event(job, event, flags)
        self._publish_counts()

    def _on_event(self, job: _Job, event: Any, flags: Any) -> None:
        token = event.token if event.flags & flags.TOKEN else None
        finished = event.flags & flags.TURN_FINISHED
        self._advance(job, token, self._finish_reason(event.finish_reason) if finished else None)

    def _step_lane(self) -> None:
        for job, token, finish, error in self.lane.step():
            if error is not None:
                self._finish(job, GenerationFailed(f"generation failed: {error}"))
            else:
                self._advance(job, token, finish)
        self._publish_counts()

    def _advance(self, job: _Job, token: int | None, finish: FinishReason | None) -> None:
        """One generated token (or none) and maybe the end, on either lane."""
        text, tokens = "", 0
        if token is not None:
            tokens = 1
            job.generated += 1
            text = job.matcher.feed(job.decoder.decode(token))
        # Log probabilities, when asked for, were noted on the job by the lane (ortgenai_lora);
        # an end-of-sequence token has one too (lm-eval's loglikelihood expects one per token
        # generated), though it adds no text and no count, as on the engine path.
        logprobs = () if job.logprob is None else (job.logprob,)
        echoed, job.prompt_logprobs, job.logprob = job.prompt_logprobs, None, None
        if job.matcher.stopped:
            delta = GenerationDelta(text, tokens, "stop", logprobs, echoed)
            self._finish(job, delta)
        elif finish is not None:
            delta = GenerationDelta(text + job.matcher.flush(), tokens, finish, logprobs, echoed)
            self._finish(job, delta)
        else:
            self._deliver(job.add.request_id, GenerationDelta(text, tokens, None, logprobs, echoed))

    def _finish_reason(self, reason: Any) -> FinishReason:
        og_reason = self._og.FinishReason
        if reason in (og_reason.MAX_GENERATED_TOKENS, og_reason.MAX_SESSION_TOKENS):
            return "length"
        if reason == og_reason.CANCELLED:
            return "abort"
        if reason == og_reason.FAILED:
            raise RuntimeError("turn finished as FAILED without a FAILED event")
        return "stop"  # EOS, or og's own stop strings

    def _finish(self, job: _Job, last: GenerationDelta | Exception) -> None:
        self._deliver(job.add.request_id, last)
        self._release(job)

    def _abort(self, request_id: str) -> None:
        job = self._by_id.get(request_id)
        if job is None:
            return
        if job.og_request is None and job.generator is None:
            self._waiting.remove(job)
            self._by_id.pop(request_id, None)
            self._deliver(request_id, GenerationDelta("", 0, "abort"))
        else:
            self._finish(job, GenerationDelta("", 0, "abort"))

    def _release(self, job: _Job) -> None:
        self._by_id.pop(job.add.request_id, None)
        if job.og_request is not None:
            self._running.pop(job.og_request, None)
            job.og_request.close()  # frees its batch row and purges its undelivered events
            job.og_request = None
        self.lane.remove(job)

    def _publish_counts(self) -> None:
        self._set_counts(len(self._running) + len(self.lane.jobs), len(self._waiting))

    def release(self) -> None:
        for job in [*self._running.values(), *self.lane.jobs]:
            self._release(job)
        self.lane.release()
        self._waiting.clear()
        self._by_id.clear()
        del self._engine, self._buffer, self._tokenizer, self._model


def _needs_logits(sampling: SamplingSettings) -> bool:
    # og.Engine returns tokens only: log probabilities need a Generator (the lane) for logits.
    return sampling.logprobs is not None or sampling.echo


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
