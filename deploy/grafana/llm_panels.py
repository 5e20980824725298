"""Ferry / LLM: token-level latency and throughput of /v1/chat/completions."""

from __future__ import annotations

from dashboard_kit import (
    CACHE_HITS,
    CACHE_QUERIES,
    DURATION,
    FINISHED,
    GENERATION_TOKENS,
    GUIDED_ITL,
    ITL,
    KV_USAGE,
    LORA_INFO,
    PROMPT_TOKENS,
    RATE,
    REQUESTS,
    RUNNING,
    SPEC_ACCEPTED,
    SPEC_DRAFTED,
    STRUCTURED,
    TTFT,
    WAITING,
    M,
    Panel,
    quantiles,
    rate_by,
    rate_panel,
)

LLM = (
    Panel(
        "Time to first token",
        quantiles(TTFT, M),
        unit="s",
        description="From request received to the first generated token.",
    ),
    Panel(
        "Inter-token latency",
        quantiles(ITL, M),
        unit="s",
        description="Time between consecutive generated tokens of one request.",
    ),
    Panel(
        "Request duration",
        quantiles(DURATION, M),
        unit="s",
        description="From request received to the last token.",
    ),
    Panel(
        "Tokens/s",
        (("prompt", rate_by("", PROMPT_TOKENS)), ("generation", rate_by("", GENERATION_TOKENS))),
        description="Prompt tokens read and tokens generated per second.",
    ),
    Panel(
        "Requests running / waiting",
        (("running", f"sum({RUNNING}{{{M}}})"), ("waiting", f"sum({WAITING}{{{M}}})")),
        description="Requests generating now, and those queued for a slot.",
    ),
    Panel(
        "Prefix cache: prompt tokens reused",
        (
            (
                "hit rate",
                f"{rate_by('', CACHE_HITS)} / clamp_min({rate_by('', CACHE_QUERIES)}, 1e-9)",
            ),
        ),
        unit="percentunit",
        description="Share of prompt tokens found computed (vLLM's prefix_cache_hits/queries).",
    ),
    Panel(
        "Speculation: drafted tokens accepted",
        (
            (
                "acceptance",
                f"{rate_by('', SPEC_ACCEPTED)} / clamp_min({rate_by('', SPEC_DRAFTED)}, 1e-9)",
            ),
        ),
        unit="percentunit",
        description="Share of prompt-lookup drafts the verify step kept (`spec_tokens` > 0; "
        "vLLM's spec_decode accepted/draft tokens).",
    ),
    rate_panel(
        "Finished requests/s by reason", "finish_reason", FINISHED, "stop, length, abort, error..."
    ),
    Panel(
        "Generated tokens per request",
        (("mean", f"{rate_by('', GENERATION_TOKENS)} / {rate_by('', FINISHED)}"),),
        description="Mean completion length.",
    ),
    rate_panel(
        "Chat HTTP responses/s",
        "status",
        REQUESTS,
        "/v1/chat/completions responses by status code.",
        selector=f'endpoint="/v1/chat/completions", {M}',
    ),
    # LoRA adapters are served models of their own name: these split the load and latency by
    # it (base models and adapters alike; running/waiting above are per base engine).
    rate_panel(
        "Generated tokens/s by model or adapter",
        "model",
        GENERATION_TOKENS,
        "Tokens generated per second by each base model and each LoRA adapter.",
        unit="short",
    ),
    Panel(
        "Time to first token p95 by model or adapter",
        (
            (
                "{{model}}",
                f"histogram_quantile(0.95, sum by (le, model) (rate({TTFT}_bucket{{{M}}}{RATE})))",
            ),
        ),
        unit="s",
        description="Whether one adapter waits longer than the others for its first token.",
    ),
    rate_panel(
        "Finished requests/s by model or adapter",
        "model",
        FINISHED,
        "Request rate per base model and per LoRA adapter.",
    ),
    rate_panel(
        "Structured-output requests/s by kind",
        "kind",
        STRUCTURED,
        "Requests under a grammar: response_format json_object / json_schema, "
        "vLLM's guided_*, or tools.",
    ),
    Panel(
        "Inter-token latency p50, guided vs all",
        (
            (
                "guided",
                f"histogram_quantile(0.5, sum by (le) (rate({GUIDED_ITL}_bucket{{{M}}}{RATE})))",
            ),
            ("all", f"histogram_quantile(0.5, sum by (le) (rate({ITL}_bucket{{{M}}}{RATE})))"),
        ),
        unit="s",
        description="The gap is what grammar masks cost per token (the engine times none itself).",
    ),
    Panel(
        "KV cache usage (inference gateway)",
        (("{{model}} busiest pod", f"max by (model) ({KV_USAGE}{{{M}}})"),),
        unit="percentunit",
        description="KV positions running generations hold over what the engine admits (running "
        "slots x context): the endpoint picker's KVCacheUtilization.",
    ),
    Panel(
        "Pods by LoRA adapters (inference gateway)",
        (
            (
                "loaded {{running_lora_adapters}} waiting {{waiting_lora_adapters}} "
                "(max {{max_lora}})",
                f"count by (running_lora_adapters, waiting_lora_adapters, max_lora) "
                f"({LORA_INFO}{{{M}}})",
            ),
        ),
        description="The LoRA info the endpoint picker routes adapter requests by.",
    ),
)
