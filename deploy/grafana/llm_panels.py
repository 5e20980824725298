"""Ferry / LLM: token-level latency and throughput of /v1/chat/completions."""

from __future__ import annotations

from dashboard_kit import RATE, M, Panel, ferry_metric, quantiles, rate_by

REQUESTS = ferry_metric("requests")
TTFT = ferry_metric("llm_ttft")
ITL = ferry_metric("llm_itl")
DURATION = ferry_metric("llm_duration")
PROMPT_TOKENS = ferry_metric("llm_prompt_tokens")
GENERATION_TOKENS = ferry_metric("llm_generation_tokens")
FINISHED = ferry_metric("llm_finished")
RUNNING = ferry_metric("llm_running")
WAITING = ferry_metric("llm_waiting")
STRUCTURED = ferry_metric("llm_structured")
GUIDED_ITL = ferry_metric("llm_guided_itl")
CACHE_QUERIES = ferry_metric("llm_prefix_cache_queries")
CACHE_HITS = ferry_metric("llm_prefix_cache_hits")

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
        "Finished requests/s by reason",
        (("{{finish_reason}}", rate_by("finish_reason", FINISHED)),),
        unit="reqps",
        description="stop, length, abort, error...",
    ),
    Panel(
        "Generated tokens per request",
        (("mean", f"{rate_by('', GENERATION_TOKENS)} / {rate_by('', FINISHED)}"),),
        description="Mean completion length.",
    ),
    Panel(
        "Chat HTTP responses/s",
        (("{{status}}", rate_by("status", REQUESTS, f'endpoint="/v1/chat/completions", {M}')),),
        unit="reqps",
        description="/v1/chat/completions responses by status code.",
    ),
    # LoRA adapters are served models of their own name: these split the load and latency by
    # it (base models and adapters alike; running/waiting above are per base engine).
    Panel(
        "Generated tokens/s by model or adapter",
        (("{{model}}", rate_by("model", GENERATION_TOKENS)),),
        description="Tokens generated per second by each base model and each LoRA adapter.",
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
    Panel(
        "Finished requests/s by model or adapter",
        (("{{model}}", rate_by("model", FINISHED)),),
        unit="reqps",
        description="Request rate per base model and per LoRA adapter.",
    ),
    Panel(
        "Structured-output requests/s by kind",
        (("{{kind}}", rate_by("kind", STRUCTURED)),),
        unit="reqps",
        description="Requests under a grammar: response_format json_object / json_schema, "
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
)
