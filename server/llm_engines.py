"""Build the configured LLM engines (the engines themselves live in `llm/`)."""

from __future__ import annotations

from ferry.llm.base import LLMEngine
from ferry.llm.options import VLLMOptions
from ferry.llm.ortgenai_prefix import PrefixCache
from ferry.server.settings import LLMSettings, Settings


def build_llm_engines(settings: Settings) -> dict[str, LLMEngine]:
    """Every configured LLM engine; the ortgenai ones share one prefix cache, so that one
    budget (`prefix_cache_bytes`) covers all models."""
    store = PrefixCache(settings.prefix_cache_bytes)
    return {m.name: build_llm_engine(m, store) for m in settings.llm_models}


def build_llm_engine(settings: LLMSettings, prefix_store: PrefixCache | None = None) -> LLMEngine:
    options = settings.options
    if isinstance(options, VLLMOptions):
        from ferry.llm.vllm import create_vllm_engine  # imports vllm lazily: GPU hosts only

        return create_vllm_engine(
            settings.path,
            name=settings.name,
            gpu_memory_utilization=options.gpu_memory_utilization,
            adapters=settings.adapters,
            enable_lora=settings.adapter_dir is not None,
            max_adapters=settings.max_adapters,
            max_lora_rank=options.max_lora_rank,
            special_tokens_in_content=settings.special_tokens_in_content,
            enable_prefix_caching=settings.prefix_cache,
            batch_invariant=settings.batch_invariant,
        )
    from ferry.llm.ortgenai import OrtGenAIEngine

    return OrtGenAIEngine(
        settings.path,
        name=settings.name,
        max_running=options.max_running,
        max_waiting=options.max_waiting,
        prefix_cache=settings.prefix_cache,
        prefix_store=prefix_store,
        prefill_chunk=options.prefill_chunk,
        deterministic=settings.batch_invariant,
        spin_us=options.spin_us,
        spec_tokens=options.spec_tokens,
        adapters=settings.adapters,
        max_adapters=settings.max_adapters,
        special_tokens_in_content=settings.special_tokens_in_content,
    )
