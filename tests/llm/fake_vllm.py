"""vLLM faked at its boundary only: AsyncLLM's output stream, shaped as vLLM's output processor
shapes it (vllm/v1/engine/output_processor.py), so the adapter code above it runs for real.

The fake honours the request's `output_kind` as vLLM does: CUMULATIVE (SamplingParams' default)
repeats all text, ids and logprobs so far on every output; DELTA sends only the new ones and the
prompt's logprobs once, on the first output. An adapter that forgets to ask for deltas, or
re-slices them, reads the wrong text here.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class RequestOutputKind(enum.Enum):  # shaped like vllm.sampling_params.RequestOutputKind
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class Logprob:  # shaped like vllm.sequence.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


Position = dict[int, Logprob]  # vLLM's candidates at one position: {token id: Logprob}


@dataclass
class CompletionOutput:  # shaped like vllm.outputs.CompletionOutput
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[Position] | None = None
    finish_reason: str | None = None


@dataclass
class RequestOutput:  # shaped like vllm.outputs.RequestOutput
    request_id: str
    prompt_token_ids: list[int]
    prompt_logprobs: list[Position | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int | None = None


@dataclass(frozen=True)
class FakeLoRARequest:  # shaped like vllm.lora.request.LoRARequest
    lora_name: str
    lora_int_id: int
    lora_path: str


@dataclass
class FakeSamplingParams:
    kwargs: dict[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.kwargs[name]


def sampling_params(**kwargs: Any) -> FakeSamplingParams:
    return FakeSamplingParams(kwargs)


@dataclass
class FakeAsyncLLM:
    """Streams a scripted list of (text, token ids) steps, one output each."""

    steps: list[tuple[str, list[int]]]
    finish_reason: str = "length"
    hold: asyncio.Event | None = None  # when set, stream pauses after the first output
    cached: int | None = None  # num_cached_tokens on every output, as vLLM reports it
    # The candidates at a generated token's position / at a prompt token's (logprobs requested).
    position: Callable[[int], Position] | None = None
    prompt_position: Callable[[int], Position] | None = None
    aborted: list[str] = field(default_factory=list)
    calls: list[tuple[Any, Any, str]] = field(default_factory=list)
    priorities: list[int] = field(default_factory=list)
    loras: list[Any] = field(default_factory=list)  # the lora_request of each generate call
    added: dict[int, Any] = field(default_factory=dict)  # as AsyncLLM.add_lora keeps them
    removed: list[int] = field(default_factory=list)

    async def generate(
        self,
        prompt: Any,
        params: Any,
        request_id: str,
        lora_request: Any = None,
        priority: int = 0,  # AsyncLLM.generate's keyword
    ) -> AsyncIterator[RequestOutput]:
        self.calls.append((prompt, params, request_id))
        self.priorities.append(priority)
        self.loras.append(lora_request)
        if lora_request is not None:
            assert self.added.get(lora_request.lora_int_id) == lora_request  # loaded first
        kwargs = params.kwargs
        delta = kwargs.get("output_kind", RequestOutputKind.CUMULATIVE) == RequestOutputKind.DELTA
        prompt_ids = prompt["prompt_token_ids"]
        echoed = None
        if kwargs.get("prompt_logprobs") is not None:
            assert self.prompt_position is not None
            echoed = [None, *(self.prompt_position(t) for t in prompt_ids[1:])]
        wanted = kwargs.get("logprobs") is not None
        text, ids = "", []
        for i, (piece, piece_ids) in enumerate(self.steps):
            if delta:
                shown_text, shown_ids = piece, piece_ids
            else:
                text, ids = text + piece, ids + piece_ids
                shown_text, shown_ids = text, ids
            logprobs = None
            if wanted:
                assert self.position is not None
                logprobs = [self.position(t) for t in shown_ids]
            last = i == len(self.steps) - 1
            reason = self.finish_reason if last else None
            completion = CompletionOutput(0, shown_text, list(shown_ids), logprobs, reason)
            prompt_logprobs = None if delta and i > 0 else echoed  # DELTA pops them once
            yield RequestOutput(
                request_id, prompt_ids, prompt_logprobs, [completion], last, self.cached
            )
            if self.hold is not None:
                await self.hold.wait()

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def add_lora(self, lora_request: Any) -> bool:
        if not Path(lora_request.lora_path, "adapter_config.json").is_file():
            raise ValueError(f"no adapter at {lora_request.lora_path}")
        self.added[lora_request.lora_int_id] = lora_request
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.removed.append(lora_id)
        return self.added.pop(lora_id, None) is not None
