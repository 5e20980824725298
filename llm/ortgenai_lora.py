"""Requests only an og.Generator serves, each on its own batch-1 generator, stepped in turn.

Most requests run on the batch lane (ortgenai_batch.py). These do not (ortgenai_batch.
needs_generator): a LoRA adapter (onnxruntime-genai 0.18 selects adapters only per Generator,
`set_active_adapter`, before any token goes in; the model must be exported with LoRA inputs,
tools/build_tiny_lora.py). A grammar or `echo` alone runs on the batch lane; with an adapter,
a grammar's mask (grammar_rows.py) goes onto the generator's logits (`set_logits`) before each
token, and `echo` scores every prompt position after one whole `append_tokens`. Their
generators are never reused across requests, so unloading an adapter is never held up, and none
of them reads or fills the prefix cache.

One turn (`step`) gives every running request one unit of work: the next chunk of its prompt
(`prefill_chunk` tokens; never a piece of one token, which the CPU kernels compute differently,
see ortgenai_prefix.py) or one new token. The last prompt chunk is followed at once by the first
token (og samples it from the logits the chunk left).
Log probabilities come from the generator's logits: the prompt's (for `echo`) and the last
position's before each new token; the model's own distribution before temperature or top-p,
noted on the job for the owner loop's delta.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ferry.llm.base import FinishReason, SamplingSettings
from ferry.llm.grammar_rows import GrammarCompiler, RowGrammar
from ferry.llm.logprobs import log_softmax, prompt_logprobs, token_logprob
from ferry.llm.sampling import end_ids, restricted, restricts


def adapter_key(name: str, adapter_id: int) -> str:
    """The runtime's name for one load of an adapter: unique even when a name is reloaded."""
    return f"{name}#{adapter_id}"


def adapter_name(key: str) -> str:
    """The adapter name of a runtime key (`adapter_key`)."""
    return key.rsplit("#", 1)[0]


def search_options(sampling: SamplingSettings) -> dict[str, Any]:
    """og search options for `sampling`, except max_length: the one place sampling settings
    become GeneratorParams search options (penalties such as `repetition_penalty` belong here)."""
    options: dict[str, Any] = {}
    if sampling.greedy:
        options["do_sample"] = False
    else:  # OpenAI semantics: nucleus only (top_k 0), no implicit top-k from the config
        options.update(
            do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0
        )
    if sampling.seed is not None:
        # og's random_seed is a C int where -1 means unseeded; OpenAI's seed is any int64:
        # folded into [0, 2**31), still one stream per seed.
        options["random_seed"] = sampling.seed % 2**31
    if sampling.repetition_penalty != 1.0:
        options["repetition_penalty"] = sampling.repetition_penalty
    return options


class GeneratorLane:
    """Running requests, each on its own og.Generator. Lives and dies on the owner thread."""

    def __init__(
        self,
        og: Any,
        model: Any,
        eos_ids: set[int],
        grammars: GrammarCompiler,
        *,
        prefill_chunk: int = 0,
    ) -> None:
        self._og = og
        self._grammars = grammars
        self._model = model
        self._adapters = og.Adapters(model)
        self._eos_ids = eos_ids
        self._chunk = prefill_chunk  # 0: a whole prompt in one piece; else at least 2
        self.jobs: list[Any] = []  # the owner loop's jobs running here, in admission order

    def load(self, key: str, path: Path) -> None:
        self._adapters.load(str(path), key)

    def unload(self, key: str) -> None:
        self._adapters.unload(key)  # og refuses while a generator still uses it

    def begin(
        self, job: Any, adapter: str | None, prompt_ids: list[int], sampling: SamplingSettings
    ) -> None:
        """Give `job` a new generator; its prompt goes in over the next turns (`step`)."""
        options = search_options(sampling)
        need = len(prompt_ids) + sampling.max_tokens
        job.generator = self._new_generator(options, need, adapter)
        guidance = sampling.guidance  # compiled on the pool while the prompt goes in
        job.grammar = None if guidance is None else self._grammars.compile(guidance)
        job.tokens, job.pending, job.cached_tokens = [], list(prompt_ids), 0
        job.ends = end_ids(self._eos_ids, sampling)
        if sampling.echo:  # every prompt position's logits: one piece, now
            self._feed(job, len(job.pending))
            logits = job.generator.get_output("logits")[0]
            job.prompt_logprobs = prompt_logprobs(logits, prompt_ids, sampling.logprobs or 0)
        self.jobs.append(job)

    def _new_generator(self, options: dict[str, Any], max_length: int, adapter: str | None) -> Any:
        og = self._og
        params = og.GeneratorParams(self._model)
        params.set_search_options(max_length=max_length, **options)
        generator = og.Generator(self._model, params)
        if adapter is not None:
            generator.set_active_adapter(self._adapters, adapter)  # before any token goes in
        return generator

    def _feed(self, job: Any, count: int) -> None:
        if len(job.pending) - count == 1:
            count -= 1  # leave two for the last piece: a piece of one runs other kernels
        piece, job.pending = job.pending[:count], job.pending[count:]
        job.generator.append_tokens(np.asarray(piece, dtype=np.int32))
        job.tokens += piece

    def remove(self, job: Any) -> None:
        """Take `job` off the lane; its generator is freed here, on the owner thread (an
        adapter's generator releases the adapter too)."""
        if job.generator is None:
            return
        self.jobs.remove(job)
        job.generator = None
        if job.grammar is not None:
            job.grammar.cancel()  # still queued: never compiled
            job.grammar = None

    def step(self) -> Iterator[tuple[Any, int | None, FinishReason | None, Exception | None]]:
        """One unit of work for every running request: (job, token or None, finish reason or
        None, error or None); a turn spent on a prompt chunk yields nothing for its job."""
        for job in list(self.jobs):
            # og's binding holds the GIL through a whole step: let the event loop in between
            # steps, or its deltas, aborts and HTTP wait for a whole turn of every request.
            time.sleep(0)
            generator = job.generator
            if generator is None:  # aborted during this turn (the owner reads its commands
                continue  # at each first token)
            top = job.add.sampling.logprobs
            try:
                if job.pending:
                    self._feed(job, self._chunk or len(job.pending))
                    if job.pending:
                        continue
                grammar: RowGrammar | None = None
                if job.grammar is not None:
                    grammar = job.grammar.result()  # raises the compile's error
                row = None if top is None else log_softmax(generator.get_logits()[0, -1])
                if grammar is not None or restricts(job.add.sampling):
                    generator.set_logits(self._masked(job, grammar, generator.get_logits()))
                generator.generate_next_token()
                token = int(generator.get_next_tokens()[0])
                job.logprob = None if row is None else token_logprob(row, token, top)
                if grammar is not None and token not in job.ends:
                    grammar.consume(token)
            except Exception as exc:  # this request failed; the others go on
                yield job, None, None, exc
                continue
            if token in job.ends:  # not counted or emitted, as OpenAI servers do
                yield job, None, "stop", None
            elif generator.is_done() or job.generated + 1 >= job.add.sampling.max_tokens:
                yield job, token, "length", None
            else:
                yield job, token, None, None

    @staticmethod
    def _masked(job: Any, grammar: RowGrammar | None, logits: np.ndarray) -> np.ndarray:
        """The generator's last-position logits with what the grammar and the request's
        limits (sampling.restricted) rule out at float32's lowest, as og's guidance writes."""
        if grammar is not None:
            logits = grammar.masked(logits)
        sampling = job.add.sampling
        if restricts(sampling):
            floor = float(np.finfo(np.float32).min)
            logits = np.array(logits, dtype=np.float32)  # a copy: og's buffer stays as it was
            logits[0, -1] = restricted(logits[0, -1], sampling, job.ends, job.generated, floor)
        return logits

    def release(self) -> None:
        for job in list(self.jobs):
            self.remove(job)
        del self._adapters, self._model
