"""vLLM adapter: AsyncLLM's RequestOutput stream turned into Ferry's GenerationDeltas.

vllm is imported only inside `create_vllm_engine`, so this module imports (and its adapter logic
is tested) on machines without vllm or a GPU. The serving layer tokenizes with the
model's own tokenizer files (ChatTokenizer) and vLLM receives token ids, so usage counts match
what the model saw.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, Unpack

from ferry.llm.adapters import AdapterTable
from ferry.llm.base import (
    SAMPLING_OPTIONS,
    EngineStats,
    FinishReason,
    GenerateOptions,
    GenerationDelta,
    SamplingSettings,
    TokenLogprob,
    check_admission,
    generate_options,
)
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.errors import InvalidAdapter, InvalidSampling, adapter_refused

_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


# vLLM's structured-output parameters: the class and the SamplingParams field that takes it.
# vLLM >= 0.10.2 names them StructuredOutputsParams / `structured_outputs`; 0.8 to 0.10
# GuidedDecodingParams / `guided_decoding`. Both take `json`, `regex` and `grammar`.
StructuredParams = tuple[Callable[..., Any], str]
_GUIDANCE_FIELDS = {"json_schema": "json", "regex": "regex", "lark_grammar": "grammar"}


def to_sampling_params(
    settings: SamplingSettings,
    params_cls: Callable[..., Any],
    structured: StructuredParams | None = None,
) -> Any:
    """SamplingSettings -> vllm.SamplingParams; the output kind (DELTA) is set by the engine."""
    extra: dict[str, Any] = {}
    guidance = settings.guidance
    if guidance is not None:
        if structured is None:
            raise InvalidSampling("response_format", "this vLLM has no structured outputs")
        cls, field = structured
        value = json.loads(guidance.data) if guidance.kind == "json_schema" else guidance.data
        extra[field] = cls(**{_GUIDANCE_FIELDS[guidance.kind]: value})
    return params_cls(
        n=1,  # Ferry runs n generations as n requests, so each can be aborted on its own
        max_tokens=settings.max_tokens,
        temperature=0.0 if settings.greedy else settings.temperature,
        top_p=settings.top_p,
        seed=settings.seed,
        stop=list(settings.stop),
        logprobs=settings.logprobs,
        prompt_logprobs=settings.logprobs if settings.echo else None,
        repetition_penalty=settings.repetition_penalty,
        presence_penalty=settings.presence_penalty,
        frequency_penalty=settings.frequency_penalty,
        logit_bias=dict(settings.logit_bias) or None,
        top_k=settings.top_k or -1,  # vLLM's "all tokens" (0 as well, since 0.10)
        min_p=settings.min_p,
        min_tokens=settings.min_tokens,
        ignore_eos=settings.ignore_eos,
        stop_token_ids=list(settings.stop_token_ids),
        include_stop_str_in_output=settings.include_stop_str_in_output,
        skip_special_tokens=settings.skip_special_tokens,
        **extra,
    )


def structured_params() -> tuple[StructuredParams, dict[str, Any]]:
    """The installed vLLM's structured-output class and field, and the engine arguments that
    select llguidance as its backend: Ferry's grammars are llguidance's (tool calls use its
    Lark `%json`), checked with llguidance before a request is queued."""
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams

        return (GuidedDecodingParams, "guided_decoding"), {"guided_decoding_backend": "guidance"}
    from vllm.config import StructuredOutputsConfig

    backend = {"structured_outputs_config": StructuredOutputsConfig(backend="guidance")}
    return (StructuredOutputsParams, "structured_outputs"), backend


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


def to_delta(
    output: Any, prompt_ids: list[int], sampling: SamplingSettings, first: bool
) -> GenerationDelta:
    """One vLLM RequestOutput of kind DELTA (only what its step added) -> Ferry's delta."""
    completion = output.outputs[0]
    ids = completion.token_ids
    logprobs: tuple[TokenLogprob, ...] = ()
    echoed = None
    top = sampling.logprobs
    if top is not None:
        if ids:  # vLLM slices `logprobs[-len(ids):]`, which is all of them for no ids
            pairs = zip(ids, completion.logprobs, strict=True)
            logprobs = tuple(to_token_logprob(t, p, top) for t, p in pairs)
        if sampling.echo and first:  # DELTA sends the prompt's logprobs once
            echoed = prompt_entries(prompt_ids, output.prompt_logprobs, top)
    reason = None
    if completion.finish_reason is not None or output.finished:
        reason = _FINISH_REASONS.get(str(completion.finish_reason), "stop")
    cached = getattr(output, "num_cached_tokens", None) if first else None
    return GenerationDelta(completion.text, len(ids), reason, logprobs, echoed, cached)


class VLLMEngine:
    """An LLMEngine over a vLLM async engine (anything with `generate` and `abort`)."""

    sampling_options = frozenset(SAMPLING_OPTIONS)  # every one is a SamplingParams field

    def __init__(
        self,
        engine: Any,
        chat: ChatTokenizer,
        *,
        name: str,
        max_context_tokens: int,
        sampling_params_cls: Callable[..., Any],
        delta_output_kind: Any,
        max_concurrency: int = 256,
        lora_request_cls: Callable[..., Any] | None = None,
        adapters: Mapping[str, Path] | None = None,
        max_adapters: int = 4,
        structured: StructuredParams | None = None,
    ) -> None:
        self.name = name
        self._structured = structured
        self.max_context_tokens = max_context_tokens
        self._engine = engine
        self.tokenizer = chat
        # vllm.sampling_params.RequestOutputKind.DELTA: each output holds only what its step
        # added (text, ids, logprobs; the prompt's logprobs once), as vLLM's own OpenAI server
        # streams. The class default, CUMULATIVE, resends everything so far on every step.
        self._params_cls = functools.partial(sampling_params_cls, output_kind=delta_output_kind)
        self._max_concurrency = max_concurrency
        self._active: set[str] = set()
        self._closed = False
        self._lora_cls = lora_request_cls  # vllm.lora.request.LoRARequest; None: LoRA is off
        self._initial_adapters = dict(adapters or {})
        self._adapters = AdapterTable(max_adapters)
        self._lora_requests: dict[int, Any] = {}  # adapter id (vLLM's lora_int_id) -> LoRARequest
        self._cache_queries = self._cache_hits = 0  # prompt tokens, from num_cached_tokens

    async def start(self) -> None:
        """AsyncLLM starts its engine core on construction; only the adapters are left."""
        for name, path in self._initial_adapters.items():
            await self.load_adapter(name, path)

    def adapter_names(self) -> list[str]:
        return self._adapters.names()

    async def load_adapter(self, name: str, path: Path) -> None:
        if self._lora_cls is None:
            raise InvalidAdapter("lora_name", f"LoRA is not enabled on {self.name}")
        adapter_id = self._adapters.reserve(name)
        request = self._lora_cls(lora_name=name, lora_int_id=adapter_id, lora_path=str(path))
        try:
            # Loaded now rather than on its first request, so a bad adapter fails here.
            if not await self._engine.add_lora(request):
                raise RuntimeError("vLLM refused it")
        except Exception as exc:
            self._adapters.cancel(name)
            raise adapter_refused(name, path, exc) from None
        self._lora_requests[adapter_id] = request
        self._adapters.commit(name, adapter_id)

    async def unload_adapter(self, name: str) -> None:
        """New requests on `name` fail at once; vLLM drops it once its requests finished."""
        adapter_id = await self._adapters.retire(name)
        del self._lora_requests[adapter_id]
        await self._engine.remove_lora(adapter_id)

    async def close(self) -> None:
        self._closed = True
        shutdown = getattr(self._engine, "shutdown", None)
        if shutdown is not None:
            result = shutdown()
            if inspect.isawaitable(result):
                await result

    def is_ready(self) -> bool:
        return not self._closed and not getattr(self._engine, "errored", False)

    @property
    def max_concurrent_generations(self) -> int:
        return self._max_concurrency

    def stats(self) -> EngineStats:
        # vLLM schedules internally; from here every in-flight request counts as running.
        # Its KV usage and waiting adapters are inside vLLM's scheduler: left unreported.
        return EngineStats(
            len(self._active),
            0,
            self._cache_queries,
            self._cache_hits,
            running_lora_adapters=tuple(self._adapters.names()),
        )

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingSettings,
        **options: Unpack[GenerateOptions],
    ) -> AsyncIterator[GenerationDelta]:
        adapter, priority, cache_salt = generate_options(options)
        check_admission(self.name, self.is_ready(), len(self._active), self._max_concurrency)
        params = to_sampling_params(sampling, self._params_cls, self._structured)
        adapter_id = self._adapters.acquire(adapter) if adapter is not None else None
        lora = None if adapter_id is None else self._lora_requests[adapter_id]
        self._active.add(request_id)
        finished = False
        first = True
        try:
            # vLLM's own engine prompt shape: token ids, tokenized once by the serving layer;
            # its cache_salt is mixed into the first block's hash (no reuse across salts).
            prompt: dict[str, Any] = {"prompt_token_ids": prompt_ids}
            if cache_salt is not None:
                prompt["cache_salt"] = cache_salt
            stream = self._engine.generate(
                prompt,
                params,
                request_id=request_id,
                lora_request=lora,
                priority=priority,
            )
            async for output in stream:
                delta = to_delta(output, prompt_ids, sampling, first)
                if first:  # vLLM's automatic prefix caching: prompt tokens it found computed
                    first = False
                    self._cache_queries += len(prompt_ids)
                    self._cache_hits += delta.cached_tokens or 0
                finished = delta.finish_reason is not None
                yield delta
                if finished:
                    return
        finally:
            self._active.discard(request_id)
            if not finished:  # cancelled or closed early: free the engine's slot
                result = self._engine.abort(request_id)
                if inspect.isawaitable(result):
                    await result
            if adapter_id is not None:
                self._adapters.release(adapter_id)


def create_vllm_engine(
    model_dir: str | Path,
    *,
    name: str = "tiny-llm",
    max_model_len: int | None = None,
    gpu_memory_utilization: float = 0.3,
    adapters: Mapping[str, Path] | None = None,
    enable_lora: bool = False,
    max_adapters: int = 4,
    max_lora_rank: int = 16,
    special_tokens_in_content: bool = False,
    enable_prefix_caching: bool = True,
    batch_invariant: bool = False,
    **engine_kwargs: Any,
) -> VLLMEngine:
    """Build a VLLMEngine from a Hugging Face model folder; needs vllm (and a GPU) installed.

    With LoRA on (`enable_lora`, or configured adapters), `max_adapters` is vLLM's `max_loras`
    (adapters in one batch) and also how many Ferry keeps loaded, so every loaded adapter can
    run at once. `enable_prefix_caching` is vLLM's automatic prefix caching; `batch_invariant`
    turns on its batch-invariant kernels, which vLLM reads from the environment
    (VLLM_BATCH_INVARIANT=1, for the whole process and its engine core) before it is imported."""
    if batch_invariant:
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    chat = ChatTokenizer(model_dir, escape_special_tokens=not special_tokens_in_content)
    structured, backend = structured_params()
    if not {"structured_outputs_config", "guided_decoding_backend"} & engine_kwargs.keys():
        engine_kwargs.update(backend)
    lora = enable_lora or bool(adapters)
    if lora:
        engine_kwargs.update(enable_lora=True, max_loras=max_adapters, max_lora_rank=max_lora_rank)
    # "priority": vLLM schedules waiting requests by (priority, arrival), so `priority` is honoured
    # and requests that leave it at 0 are served first come, first served as with "fcfs".
    engine_kwargs.setdefault("scheduling_policy", "priority")
    args = AsyncEngineArgs(
        model=str(model_dir),
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        enable_prefix_caching=enable_prefix_caching,
        **engine_kwargs,
    )
    engine = AsyncLLM.from_engine_args(args)
    context = engine.model_config.max_model_len
    return VLLMEngine(
        engine,
        chat,
        name=name,
        max_context_tokens=context,
        sampling_params_cls=SamplingParams,
        delta_output_kind=RequestOutputKind.DELTA,
        lora_request_cls=LoRARequest if lora else None,
        adapters=adapters,
        max_adapters=max_adapters,
        structured=structured,
    )
