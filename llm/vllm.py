"""vLLM adapter: AsyncLLM's RequestOutput stream turned into Ferry's GenerationDeltas.

vllm is imported only inside `create_vllm_engine`, so this module imports (and its adapter logic
is tested) on machines without vllm or a GPU. The serving layer tokenizes with the
model's own tokenizer files (ChatTokenizer) and vLLM receives token ids, so usage counts match
what the model saw.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ferry.llm.base import (
    EngineStats,
    FinishReason,
    GenerationDelta,
    SamplingSettings,
    TokenLogprob,
)
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.errors import EngineDead, EngineOverloaded

_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def to_sampling_params(settings: SamplingSettings, params_cls: Callable[..., Any]) -> Any:
    """SamplingSettings -> vllm.SamplingParams (cumulative output, the class default)."""
    return params_cls(
        n=1,  # Ferry runs n generations as n requests, so each can be aborted on its own
        max_tokens=settings.max_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        seed=settings.seed,
        stop=list(settings.stop),
        logprobs=settings.logprobs,
        prompt_logprobs=settings.logprobs if settings.echo else None,
    )


def to_token_logprob(token_id: int, candidates: dict[int, Any], top: int) -> TokenLogprob:
    """vLLM's {token id: Logprob(logprob, rank)} at one position -> Ferry's entry: the chosen
    token (always present) and the `top` best by rank (1 = likeliest)."""
    ranked = sorted(
        (c.rank, i, c.logprob)
        for i, c in candidates.items()
        if c.rank is not None and c.rank <= top
    )
    return TokenLogprob(
        token_id, candidates[token_id].logprob, tuple((i, lp) for _, i, lp in ranked)
    )


def prompt_entries(
    prompt_ids: list[int], positions: list[dict[int, Any] | None], top: int
) -> tuple[TokenLogprob | None, ...]:
    return tuple(
        None if p is None else to_token_logprob(t, p, top)
        for t, p in zip(prompt_ids, positions, strict=True)
    )


class VLLMEngine:
    """An LLMEngine over a vLLM async engine (anything with `generate` and `abort`)."""

    def __init__(
        self,
        engine: Any,
        chat: ChatTokenizer,
        *,
        name: str,
        max_context_tokens: int,
        sampling_params_cls: Callable[..., Any],
        max_concurrency: int = 256,
    ) -> None:
        self.name = name
        self.max_context_tokens = max_context_tokens
        self._engine = engine
        self.tokenizer = chat
        self._params_cls = sampling_params_cls
        self._max_concurrency = max_concurrency
        self._active: set[str] = set()
        self._closed = False

    async def start(self) -> None:
        """AsyncLLM starts its engine core on construction; nothing to do."""

    async def close(self) -> None:
        self._closed = True
        shutdown = getattr(self._engine, "shutdown", None)
        if shutdown is not None:
            result = shutdown()
            if inspect.isawaitable(result):
                await result

    def is_ready(self) -> bool:
        return not self._closed and not getattr(self._engine, "errored", False)

    def stats(self) -> EngineStats:
        # vLLM schedules internally; from here every in-flight request counts as running.
        return EngineStats(running=len(self._active), waiting=0)

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingSettings
    ) -> AsyncIterator[GenerationDelta]:
        if not self.is_ready():
            raise EngineDead(f"engine {self.name} is not running")
        if len(self._active) >= self._max_concurrency:
            raise EngineOverloaded(f"engine {self.name} has {len(self._active)} requests")
        params = to_sampling_params(sampling, self._params_cls)
        self._active.add(request_id)
        finished = False
        text_len = token_len = 0
        try:
            # vLLM's own engine prompt shape: token ids, tokenized once by the serving layer.
            stream = self._engine.generate(
                {"prompt_token_ids": prompt_ids}, params, request_id=request_id
            )
            async for output in stream:
                completion = output.outputs[0]
                text = completion.text[text_len:]  # vLLM reports cumulative text and ids
                new_ids = list(completion.token_ids[token_len:])
                tokens = len(new_ids)
                logprobs, echoed = (), None
                if sampling.logprobs is not None:
                    top = sampling.logprobs
                    positions = completion.logprobs[token_len : token_len + tokens]
                    logprobs = tuple(
                        to_token_logprob(t, p, top) for t, p in zip(new_ids, positions, strict=True)
                    )
                    if sampling.echo and token_len == 0:
                        echoed = prompt_entries(prompt_ids, output.prompt_logprobs, top)
                text_len, token_len = len(completion.text), len(completion.token_ids)
                reason = None
                if completion.finish_reason is not None or output.finished:
                    reason = _FINISH_REASONS.get(str(completion.finish_reason), "stop")
                finished = reason is not None
                yield GenerationDelta(text, tokens, reason, logprobs, echoed)
                if finished:
                    return
        finally:
            self._active.discard(request_id)
            if not finished:  # cancelled or closed early: free the engine's slot
                result = self._engine.abort(request_id)
                if inspect.isawaitable(result):
                    await result


def create_vllm_engine(
    model_dir: str | Path,
    *,
    name: str = "tiny-llm",
    max_model_len: int | None = None,
    gpu_memory_utilization: float = 0.3,
    **engine_kwargs: Any,
) -> VLLMEngine:
    """Build a VLLMEngine from a Hugging Face model folder; needs vllm (and a GPU) installed."""
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    chat = ChatTokenizer(model_dir)
    args = AsyncEngineArgs(
        model=str(model_dir),
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        **engine_kwargs,
    )
    engine = AsyncLLM.from_engine_args(args)
    context = engine.model_config.max_model_len
    return VLLMEngine(
        engine, chat, name=name, max_context_tokens=context, sampling_params_cls=SamplingParams
    )
