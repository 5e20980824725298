"""The owner thread of OrtGenAIEngine (ortgenai.py): everything that touches `og.Engine`.

The engine's asyncio side sends it commands (`AddRequest`, `AbortRequest`, `OwnerCall`, `STOP`)
on a `queue.Queue`; `OwnerLoop.serve` applies them, steps the engine and the adapter lane in turn,
and hands each request's deltas back through the callbacks it was given.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ferry.llm.base import FinishReason, GenerationDelta, SamplingSettings, TokenLogprob
from ferry.llm.errors import GenerationFailed
from ferry.llm.guidance import apply_guidance
from ferry.llm.ortgenai_lora import GeneratorLane
from ferry.llm.stops import StopMatcher

_EVENT_BUFFER = 64
_IDLE_POLL_S = 0.05  # only when og reports no pending work while requests are resident
STOP = object()


@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingSettings  # max_tokens already fits the context
    adapter: str | None = None  # the runtime's adapter key; None: the base model
    priority: int = 0  # i25: vLLM's meaning, lower is admitted first


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class OwnerCall:
    """Run `action` on the owner thread (adapter loads and unloads); `done` gets its outcome."""

    action: Callable[[OwnerLoop], None]
    done: Callable[[BaseException | None], None]


@dataclass
class Job:
    """One request as the owner thread sees it."""

    add: AddRequest
    matcher: StopMatcher
    og_request: Any = None  # on the engine
    generator: Any = None  # on the adapter lane
    decoder: Any = None
    generated: int = field(default=0)
    logprob: TokenLogprob | None = None  # the last token's, when sampling.logprobs is set
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # until delivered (echo)


class OwnerLoop:
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
        self._waiting: deque[Job] = deque()
        self._running: dict[Any, Job] = {}  # og.Request -> job; events name the og.Request
        self._by_id: dict[str, Job] = {}

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
            if command is STOP:
                return False
            if isinstance(command, AddRequest):
                job = Job(command, StopMatcher(command.sampling.stop))
                self._by_id[command.request_id] = job
                self._waiting.append(job)
            elif isinstance(command, AbortRequest):
                self._abort(command.request_id)
            elif isinstance(command, OwnerCall):
                self._run_call(command)
            try:
                command = commands.get_nowait()
            except queue.Empty:
                self._publish_counts()
                return True

    def _admit(self) -> None:
        blocked: deque[Job] = deque()  # their lane is full; the other lane may still admit
        # i25: admit by priority (lower first); sorted() is stable, so arrival order within one.
        self._waiting = deque(sorted(self._waiting, key=lambda job: job.add.priority))
        while self._waiting:
            job = self._waiting.popleft()
            add = job.add
            on_lane = add.adapter is not None or needs_logits(add.sampling)
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

    def _run_call(self, call: OwnerCall) -> None:
        try:
            call.action(self)
        except Exception as exc:  # an adapter that fails to load must not kill the engine
            call.done(exc)
        else:
            call.done(None)

    def _begin(self, add: AddRequest) -> Any:
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
        apply_guidance(turn, sampling.guidance)
        # i21: repetition_penalty, the one penalty og's search has (sampling_options).
        if sampling.repetition_penalty != 1.0:
            turn.set_repetition_penalty(sampling.repetition_penalty)
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

    def _on_event(self, job: Job, event: Any, flags: Any) -> None:
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

    def _advance(self, job: Job, token: int | None, finish: FinishReason | None) -> None:
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

    def _finish(self, job: Job, last: GenerationDelta | Exception) -> None:
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

    def _release(self, job: Job) -> None:
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


def needs_logits(sampling: SamplingSettings) -> bool:
    # og.Engine returns tokens only: log probabilities need a Generator (the lane) for logits.
    return sampling.logprobs is not None or sampling.echo
