"""The owner thread of OrtGenAIEngine (ortgenai.py): everything that touches onnxruntime-genai.

The engine's asyncio side sends it commands (`AddRequest`, `AbortRequest`, `OwnerCall`, `STOP`)
on a `queue.Queue`; `OwnerLoop.serve` applies them, admits waiting requests (lowest `priority`
first, then in arrival order) onto the generator lane (ortgenai_lora.py) whenever it has room,
steps every running request once per turn, and hands each request's deltas back through the
callbacks it was given. A request that arrives while others decode starts on the next turn.

Two lanes: most requests run on the batch lane (ortgenai_batch.py: one forward pass per turn for
all of them, prefix cache, grammars masking their own rows, `echo`); those only an og.Generator
serves (an adapter: ortgenai_batch.needs_generator) run on the generator lane
(ortgenai_lora.py), one step each. Grammars are Ferry's on both (grammar_rows.py).

The generator lane's og.Model is a second copy of the weights (the batch lane runs its own
InferenceSession), so it is loaded only when first needed: at start when adapters are
configured, else never. Text comes from `tokenizers`
(detokenize.py): og's token stream drops bytes that are not UTF-8.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from ferry.llm.base import FinishReason, GenerationDelta, SamplingSettings, TokenLogprob
from ferry.llm.detokenize import TextStream
from ferry.llm.grammar_rows import GrammarCompiler
from ferry.llm.guidance import request_error
from ferry.llm.ortgenai_batch import BatchLane, needs_generator
from ferry.llm.ortgenai_kv import KVModel
from ferry.llm.ortgenai_lora import GeneratorLane
from ferry.llm.ortgenai_prefix import ModelPrefixCache, PrefixCache
from ferry.llm.stops import StopMatcher

STOP = object()

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingSettings  # max_tokens already fits the context
    adapter: str | None = None  # the runtime's adapter key; None: the base model
    priority: int = 0  # waiting requests are admitted lowest first
    # Prefix reuse happens only between requests of one salt (ortgenai_prefix.py, tenancy).
    cache_salt: str | None = None


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
    """One request as the owner thread sees it (the lane fills the generator's fields)."""

    add: AddRequest
    matcher: StopMatcher
    generator: Any = None  # on a lane
    lane: Any = None  # the lane it runs on
    sampler: Any = None  # batch lane: its token choice (sampling.Sampler)
    grammar: Any = None  # Future[grammar_rows.RowGrammar] of a constrained request
    drafts: Any = None  # batch lane, speculation on: its ngram_draft.NgramDraft
    draft_length: int = 0  # and the longest draft it checks next
    decoder: TextStream | None = None
    generated: int = field(default=0)
    logprob: TokenLogprob | None = None  # the last token's, when sampling.logprobs is set
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # until delivered (echo)
    cached_tokens: int | None = None  # prompt tokens reused; reported on the first delta
    # Lane state: prompt tokens computed, and still to go in.
    tokens: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)


@dataclass
class EngineOptions:
    """How the owner loop runs (LLMSettings for the ortgenai engine)."""

    max_running: int = 16
    prefix_cache: bool = True
    prefix_cache_bytes: int = 512 * 2**20  # for a store of its own, when none is shared
    # The process's one prefix store, shared by every model (one budget); None: one of its own.
    prefix_store: PrefixCache | None = None
    prefill_chunk: int = 256  # prompt tokens per turn; 0: a whole prompt at once
    # Greedy text independent of load: decode steps never run a single row (ortgenai_batch.py).
    deterministic: bool = False
    spin_us: int = 0  # the decoder's pool threads spin this long between ops (0: they sleep)
    # N-gram drafts of up to this many tokens, checked in one pass for a lone row; 0: off.
    spec_tokens: int = 0


class OwnerLoop:
    """Everything that touches onnxruntime-genai. Lives and dies on the owner thread."""

    def __init__(
        self,
        og: Any,
        name: str,
        kv_model: KVModel,
        text: Tokenizer,
        options: EngineOptions,
        eos_ids: set[int],
        deliver: Callable[[str, GenerationDelta | Exception], None],
        set_counts: Callable[[int, int, tuple[int, int]], None],
        flush: Callable[[], None],
    ) -> None:
        self._og = og
        self._name = name
        self._model_dir = kv_model.model_dir
        self._text = text  # the engine's own (ChatTokenizer.tokenizer): decoded from here
        self.max_running = options.max_running
        store = options.prefix_store or PrefixCache(options.prefix_cache_bytes)
        self.cache = (
            ModelPrefixCache(store, name, kv_model.token_bytes) if options.prefix_cache else None
        )
        self._grammars = GrammarCompiler(kv_model.model_dir)
        self._eos_ids = eos_ids
        self._prefill_chunk = options.prefill_chunk
        self._lane: GeneratorLane | None = None  # made on first need (generator_lane)
        self.batch = BatchLane(
            kv_model,
            self.max_running,
            eos_ids,
            cache=self.cache,
            prefill_chunk=options.prefill_chunk,
            deterministic=options.deterministic,
            grammars=self._grammars,
            spec_tokens=options.spec_tokens,
            before_forward=flush,
        )
        self._deliver = deliver
        self._set_counts = set_counts
        self._flush = flush
        self._waiting: list[tuple[int, int, Job]] = []  # heap of (priority, arrival, job)
        self._arrivals = itertools.count()
        self._by_id: dict[str, Job] = {}

    def generator_lane(self) -> GeneratorLane:
        """The generator lane, its og.Model loaded on the first call (module docstring)."""
        if self._lane is None:
            log.info("loading %s's og.Model for its generator lane (adapters)", self._name)
            model = self._og.Model(str(self._model_dir))
            self._lane = GeneratorLane(
                self._og, model, self._eos_ids, self._grammars, prefill_chunk=self._prefill_chunk
            )
        return self._lane

    def serve(self, commands: queue.Queue[object]) -> None:
        # While the batch lane runs, the last turn's deltas go to the event loop as its next
        # forward pass starts (BatchLane's before_forward), not before the commands and the
        # next step's inputs: the loop's wake-up takes the GIL for every stream's SSE work, and
        # the owner waited that out between steps when it flushed first.
        while True:
            idle = not self._waiting and not self._running()
            if idle or not self.batch.jobs:  # before any blocking wait, or no forward to come
                self._flush()
            if not self._drain(commands, block=idle):
                return
            self._admit()
            if self._running() and not self._step_lanes(commands):
                return

    def _running(self) -> int:
        lane = self._lane
        return len(self.batch.jobs) + (0 if lane is None else len(lane.jobs))

    def _drain(self, commands: queue.Queue[object], block: bool) -> bool:
        """Apply queued commands; False once told to stop."""
        try:
            command = commands.get(block=block)
        except queue.Empty:
            return True
        while True:
            if command is STOP:
                return False
            if isinstance(command, AddRequest):
                sampling = command.sampling
                matcher = StopMatcher(sampling.stop, sampling.include_stop_str_in_output)
                job = Job(command, matcher)
                self._by_id[command.request_id] = job
                heapq.heappush(self._waiting, (command.priority, next(self._arrivals), job))
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
        while self._waiting and self._running() < self.max_running:
            _, _, job = heapq.heappop(self._waiting)
            add = job.add
            generator_only = needs_generator(add.adapter, add.sampling)
            try:
                job.lane = self.generator_lane() if generator_only else self.batch
                job.lane.begin(job, add.adapter, add.prompt_ids, add.sampling)
            except Exception as exc:  # a bad request must not kill the engine
                self._by_id.pop(add.request_id, None)
                self._deliver(add.request_id, request_error(exc, add.sampling.guidance))
                continue
            job.decoder = TextStream(self._text, add.sampling.skip_special_tokens)
        self._publish_counts()

    def _run_call(self, call: OwnerCall) -> None:
        try:
            call.action(self)
        except Exception as exc:  # an adapter that fails to load must not kill the engine
            call.done(exc)
        else:
            call.done(None)

    def _step_lanes(self, commands: queue.Queue[object]) -> bool:
        """One turn of every lane; False once told to stop meanwhile (the turn still ends)."""
        serving = True
        for job, token, finish, error in self._steps():
            if error is not None:
                guidance = job.add.sampling.guidance
                self._finish(job, request_error(error, guidance, "generation failed: "))
                continue
            first = job.generated == 0
            self._advance(job, token, finish)
            if first:  # a first token goes out now, not after the rest of the turn's prefills
                self._flush()
                # Requests that arrived during this turn join it: a burst's prompts go in one
                # after another, not after the decode step of the first ones admitted (8 cached
                # prompts sent together: the first tokens of 7 waited for a decode step).
                serving = serving and self._drain(commands, block=False)
                if serving:
                    self._admit()
        self._publish_counts()
        return serving

    def _steps(self) -> Any:
        if self.batch.jobs:
            yield from self.batch.step()
        if self._lane is not None and self._lane.jobs:
            yield from self._lane.step()

    def _advance(self, job: Job, token: int | None, finish: FinishReason | None) -> None:
        """One generated token (or none) and maybe the end."""
        text, tokens = "", 0
        if token is not None:
            tokens = 1
            job.generated += 1
            assert job.decoder is not None  # set when it was admitted
            text = job.matcher.feed(job.decoder.step(token))
        # Log probabilities, when asked for, were noted on the job by the lane (ortgenai_lora);
        # an end-of-sequence token has one too (lm-eval's loglikelihood expects one per token
        # generated), though it adds no text and no count.
        logprobs = () if job.logprob is None else (job.logprob,)
        echoed, job.prompt_logprobs, job.logprob = job.prompt_logprobs, None, None
        cached, job.cached_tokens = job.cached_tokens, None  # the first delta carries it
        if job.matcher.stopped:
            finish = "stop"
        elif finish is not None:
            text += job.matcher.flush()
        delta = GenerationDelta(text, tokens, finish, logprobs, echoed, cached)
        if finish is not None:
            self._finish(job, delta)
        else:
            self._deliver(job.add.request_id, delta)

    def _finish(self, job: Job, last: GenerationDelta | Exception) -> None:
        self._deliver(job.add.request_id, last)
        self._by_id.pop(job.add.request_id, None)
        job.lane.remove(job)

    def _abort(self, request_id: str) -> None:
        job = self._by_id.get(request_id)
        if job is None:
            return
        if job.generator is None:  # still waiting
            self._waiting = [entry for entry in self._waiting if entry[2] is not job]
            heapq.heapify(self._waiting)
            self._by_id.pop(request_id, None)
            self._deliver(request_id, GenerationDelta("", 0, "abort"))
        else:
            self._finish(job, GenerationDelta("", 0, "abort"))

    def held(self) -> tuple[int, list[str | None]]:
        """(KV positions the running sequences hold, the adapter key of each waiting request),
        read from the event loop at scrape time: copies of the lists (one step under the GIL)
        and plain ints, so nothing here waits for or slows the owner thread."""
        lane = self._lane
        running = list(self.batch.jobs) + ([] if lane is None else list(lane.jobs))
        # A prompt's whole length counts from admission: its keys and values are being made.
        positions = sum(len(job.add.prompt_ids) + job.generated for job in running)
        return positions, [entry[2].add.adapter for entry in list(self._waiting)]

    def speculated(self) -> tuple[int, int]:
        """Speculation's tokens (drafted, accepted) since start: plain ints, read at scrape time."""
        return self.batch.drafted, self.batch.accepted

    def _publish_counts(self) -> None:
        cache = (0, 0) if self.cache is None else (self.cache.queries, self.cache.hits)
        self._set_counts(self._running(), len(self._waiting), cache)

    def release(self) -> None:
        self.batch.release()
        if self._lane is not None:
            self._lane.release()
        self._grammars.close()
        self._waiting.clear()
        self._by_id.clear()
        self._lane = None
