"""LoRA requests on onnxruntime-genai: one `og.Generator` each, on the engine's owner thread.

onnxruntime-genai 0.18 selects adapters only per Generator (`set_active_adapter`); its batching
`og.Engine` takes none. An adapter is a set of tensors bound to the model's LoRA inputs for a
whole session run, so requests on different adapters cannot share a step. Each adapter request
therefore runs on its own Generator, stepped one token per owner-loop turn, round-robin with
the engine's batched base step: every running request, base or adapter, advances once per turn,
so none starves. The model must be exported with LoRA inputs (tools/build_tiny_lora.py).

Requests that ask for log probabilities (`logprobs`, `echo`) run here too, with or without an
adapter, because only a Generator exposes logits: the prompt's (every position, after
`append_tokens`) and the last position's before each new token. Their log-softmax, the model's
own distribution before temperature or top-p, is noted on the job for the owner loop's delta.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ferry.llm.base import FinishReason, SamplingSettings
from ferry.llm.guidance import apply_guidance
from ferry.llm.logprobs import log_softmax, prompt_logprobs, token_logprob


def adapter_key(name: str, adapter_id: int) -> str:
    """The runtime's name for one load of an adapter: unique even when a name is reloaded."""
    return f"{name}#{adapter_id}"


class GeneratorLane:
    """Adapter requests, each on its own og.Generator. Lives and dies on the owner thread."""

    def __init__(self, og: Any, model: Any, max_running: int, eos_ids: set[int]) -> None:
        self._og = og
        self._model = model
        self._adapters = og.Adapters(model)
        self.max_running = max_running
        self._eos_ids = eos_ids
        self.jobs: list[Any] = []  # the owner loop's jobs running here, in admission order

    def load(self, key: str, path: Path) -> None:
        self._adapters.load(str(path), key)

    def unload(self, key: str) -> None:
        self._adapters.unload(key)  # og refuses while a generator still uses it

    def has_room(self) -> bool:
        return len(self.jobs) < self.max_running

    def begin(
        self, job: Any, adapter: str | None, prompt_ids: list[int], sampling: SamplingSettings
    ):
        og = self._og
        params = og.GeneratorParams(self._model)
        options: dict[str, Any] = {"max_length": len(prompt_ids) + sampling.max_tokens}
        if sampling.greedy:
            options["do_sample"] = False
        else:  # OpenAI semantics: nucleus only (top_k 0), as on the engine path
            options.update(
                do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0
            )
        if sampling.seed is not None:
            # og's random_seed is a C int where -1 means unseeded; OpenAI's seed is any int64
            # (the engine path takes it whole): folded into [0, 2**31), still one stream per seed.
            options["random_seed"] = sampling.seed % 2**31
        if sampling.repetition_penalty != 1.0:
            options["repetition_penalty"] = sampling.repetition_penalty
        params.set_search_options(**options)
        apply_guidance(params, sampling.guidance)
        generator = og.Generator(self._model, params)
        if adapter is not None:
            generator.set_active_adapter(self._adapters, adapter)  # before any token goes in
        generator.append_tokens(np.asarray(prompt_ids, dtype=np.int32))
        if sampling.echo:
            logits = generator.get_output("logits")[0]
            job.prompt_logprobs = prompt_logprobs(logits, prompt_ids, sampling.logprobs or 0)
        job.generator = generator
        self.jobs.append(job)

    def remove(self, job: Any) -> None:
        if job.generator is not None:
            self.jobs.remove(job)
            job.generator = None  # freed here, on the owner thread: releases the adapter too

    def step(self) -> Iterator[tuple[Any, int | None, FinishReason | None, Exception | None]]:
        """One token for every running adapter request: (job, token or None, finish reason or
        None, error or None)."""
        for job in list(self.jobs):
            generator = job.generator
            top = job.add.sampling.logprobs
            try:
                row = None if top is None else log_softmax(generator.get_logits()[0, -1])
                generator.generate_next_token()
                token = int(generator.get_next_tokens()[0])
                job.logprob = None if row is None else token_logprob(row, token, top)
            except Exception as exc:  # this request failed; the others go on
                yield job, None, None, exc
                continue
            if token in self._eos_ids:  # og.Engine does not count or emit it either
                yield job, None, "stop", None
            elif generator.is_done() or job.generated + 1 >= job.add.sampling.max_tokens:
                yield job, token, "length", None
            else:
                yield job, token, None, None

    def release(self) -> None:
        for job in list(self.jobs):
            self.remove(job)
        del self._adapters, self._model
