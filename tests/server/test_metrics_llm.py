"""The ferry_llm_* series (server/metrics.py): engine counts read from the engines when
Prometheus scrapes, and generation hooks whose label values are bound once per model."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from ferry.llm.base import EngineStats
from ferry.server.metrics import FerryMetrics, LLMMetricsObserver, ServedSeries

pytestmark = pytest.mark.unit


def test_engine_series_are_the_engines_own_counts_at_scrape_time():
    registry = CollectorRegistry()
    metrics = FerryMetrics(registry)
    stats = {
        "m": EngineStats(
            running=2,
            waiting=3,
            prefix_cache_queries=10,
            prefix_cache_hits=4,
            spec_draft_tokens=9,
            spec_accepted_tokens=7,
        )
    }
    assert "ferry_llm_requests_running{" not in generate_latest(registry).decode()  # no engines
    metrics.watch_llm_engines(lambda: stats)

    def sample(name: str) -> float | None:
        return registry.get_sample_value(name, {"model": "m"})

    assert sample("ferry_llm_requests_running") == 2
    assert sample("ferry_llm_requests_waiting") == 3
    assert sample("ferry_llm_prefix_cache_queries_total") == 10
    assert sample("ferry_llm_prefix_cache_hits_total") == 4
    assert sample("ferry_llm_spec_decode_draft_tokens_total") == 9
    assert sample("ferry_llm_spec_decode_accepted_tokens_total") == 7
    stats["m"] = EngineStats(running=0, waiting=1, prefix_cache_queries=12, prefix_cache_hits=4)
    assert (sample("ferry_llm_requests_running"), sample("ferry_llm_requests_waiting")) == (0, 1)
    assert sample("ferry_llm_prefix_cache_queries_total") == 12  # nothing wrote it: read anew


def test_the_inference_gateways_kv_and_lora_series_are_read_from_the_engine():
    """The model-server protocol's KVCacheUtilization gauge and LoRA info (one series a model,
    adapters comma-separated in the labels, as the endpoint picker splits them)."""
    registry = CollectorRegistry()
    metrics = FerryMetrics(registry)
    stats = {
        "m": EngineStats(
            running=1,
            waiting=1,
            kv_cache_usage=0.25,
            running_lora_adapters=("a", "b"),
            waiting_lora_adapters=("b",),
        ),
        "plain": EngineStats(running=0, waiting=0),  # no KV figure: no series
    }
    metrics.watch_llm_engines(lambda: stats)
    assert registry.get_sample_value("ferry_llm_kv_cache_usage_ratio", {"model": "m"}) == 0.25
    assert registry.get_sample_value("ferry_llm_kv_cache_usage_ratio", {"model": "plain"}) is None
    (info,) = [f for f in registry.collect() if f.name == "ferry_llm_lora_requests_info"]
    by_model = {series.labels.pop("model"): series for series in info.samples}
    assert by_model["m"].labels == {
        # max_lora: as many as are loaded, so the picker sees no room to load another here.
        "running_lora_adapters": "a,b",
        "waiting_lora_adapters": "b",
        "max_lora": "2",
    }
    assert by_model["plain"].labels == {
        "running_lora_adapters": "",
        "waiting_lora_adapters": "",
        "max_lora": "0",
    }
    assert by_model["m"].value > 0  # the scrape's time: the picker keeps the highest


def test_generation_hooks_write_the_models_series():
    registry = CollectorRegistry()
    observer = LLMMetricsObserver(FerryMetrics(registry))
    bound = observer.for_model("m")
    assert observer.for_model("m") is bound  # one binding per model, reused by every request
    bound.structured("json_schema")
    bound.first_token(0.2)
    bound.token(0.01)
    bound.guided_token(0.01)
    bound.finished("stop", 7, 2, 0.3)
    bound.finished("rejected", 5, 0, 0.0)

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"model": "m", **labels})

    assert sample("ferry_llm_generation_tokens_total") == 2
    assert sample("ferry_llm_time_to_first_token_seconds_count") == 1
    assert sample("ferry_llm_inter_token_latency_seconds_count") == 1
    assert sample("ferry_llm_guided_inter_token_latency_seconds_count") == 1
    assert sample("ferry_llm_prompt_tokens_total") == 12
    assert sample("ferry_llm_requests_finished_total", finish_reason="stop") == 1
    assert sample("ferry_llm_requests_finished_total", finish_reason="rejected") == 1
    assert sample("ferry_llm_structured_requests_total", kind="json_schema") == 1
    assert sample("ferry_llm_request_duration_seconds_count") == 2


def test_a_forgotten_model_leaves_no_series_and_binds_anew():
    """An unloaded adapter's name came from a request: forget_model removes its series
    (prometheus_client's label removal) and the observer's binding for it."""
    registry = CollectorRegistry()
    metrics = FerryMetrics(registry)
    observer = LLMMetricsObserver(metrics)
    bound = observer.for_model("adapter")
    bound.finished("stop", 7, 2, 0.3)
    observer.for_model("base").finished("stop", 1, 1, 0.1)
    metrics.request_answered("adapter", "/v1/chat/completions", 200, 0.2)
    metrics.forget_model("adapter")
    text = generate_latest(registry).decode()
    assert 'model="adapter"' not in text and 'model="base"' in text
    assert observer.for_model("adapter") is not bound  # loaded again: fresh children
    # An answer after it goes to a series of its own again, not to the removed one.
    metrics.request_answered("adapter", "/v1/chat/completions", 200, 0.2)
    answered = 'ferry_requests_total{endpoint="/v1/chat/completions",model="adapter",status="200"}'
    assert f"{answered} 1.0" in generate_latest(registry).decode()


def test_scrapes_show_only_served_models():
    registry = CollectorRegistry()
    metrics = FerryMetrics(registry)
    for model in ("served", "gone", ""):
        metrics.requests.labels(model, "/predict", "200").inc()
    text = generate_latest(ServedSeries(registry, ["served"])).decode()
    assert 'model="served"' in text and 'model=""' in text and 'model="gone"' not in text
