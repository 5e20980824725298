"""The LLM and Triton dashboards' queries, evaluated by a real Prometheus after real traffic.

LLM: `ferry serve` with the repository's ferry.toml (SmolLM2-135M-Instruct, and `tiny-llm` with
its zen adapter; the queries run on `tiny-llm`), driven through POST /v1/chat/completions, streamed
and not.
Triton: the CPU Triton of tests/triton (bench/triton_env.py) behind Ferry's triton backend.
"""

from __future__ import annotations

import tomllib
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from ferry.bench.server_process import DEFAULT_MODEL_DIR, default_model_config, ferry_server
from tests.deploy.deploy_support import (
    ROOT,
    dashboard_queries,
    finite_values,
    instant_query,
    needs_prometheus,
    scraped_total,
)
from tests.server.conftest import API_SERVERS
from tests.support.prometheus import prometheus_server
from tests.support.waiting import wait_until
from tools.render_dashboard import substitute

pytestmark = [pytest.mark.system, needs_prometheus, pytest.mark.timeout(240)]
LLM_MODEL = "tiny-llm"
TRITON_MODEL = "minilm"


def repo_models(table: str = "models") -> list[dict]:
    """ferry.toml's models, their relative paths made absolute (as `ferry serve` would)."""
    models = tomllib.loads((ROOT / "ferry.toml").read_text())[table]
    return [_absolute(m) for m in models]


def _absolute(model: dict) -> dict:
    model = {**model, "path": str(ROOT / model["path"])} if "path" in model else model
    if "adapters" in model:  # LoRA adapter files, relative to ferry.toml as well
        model["adapters"] = {k: str(ROOT / v) for k, v in model["adapters"].items()}
    return model


def chat(client: httpx.Client, i: int, stream: bool) -> int:
    body = {
        "model": LLM_MODEL,
        "messages": [{"role": "user", "content": f"Count to {i % 7 + 2}, please."}],
        "max_tokens": 24 + i % 8,  # several deltas per stream, so inter-token gaps exist
        "stream": stream,
    }
    if i % 3 == 0:  # guided traffic, for the structured-output panels
        body["guided_regex"] = "[a-z ]{4,12}"
    if not stream:
        return client.post("/v1/chat/completions", json=body).status_code
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        for _ in response.iter_lines():
            pass
        return response.status_code


@pytest.mark.parametrize("api_servers", API_SERVERS)
def test_llm_dashboard_queries_return_data(tmp_path, api_servers):
    """With API processes: request series from them, engine series from the engine process."""
    settings = {"drain_timeout_s": 2, "api_servers": api_servers}
    with ferry_server(
        repo_models(), server=settings, llm_models=repo_models("llm_models")
    ) as ferry:
        with httpx.Client(base_url=ferry.url, timeout=60) as client:
            first = chat(client, 0, stream=False)
        assert first == 200, (
            f"POST /v1/chat/completions with model {LLM_MODEL!r} answered {first}: "
            "this test needs the LLM endpoint and `tiny-llm` in ferry.toml"
        )
        target = ferry.url.removeprefix("http://")
        with prometheus_server({"ferry": target}, tmp_path) as prom:
            wait_until(lambda: scraped_total(prom.url, 'up{job="ferry"}') == 1, 30, "first scrape")

            def worker(seed: int) -> list[int]:
                with httpx.Client(base_url=ferry.url, timeout=60) as client:
                    return [chat(client, seed + 4 * k, stream=k % 2 == 0) for k in range(6)]

            with ThreadPoolExecutor(4) as pool:
                codes = [c for codes in pool.map(worker, range(4)) for c in codes]
            assert set(codes) == {200}, codes
            # Every series the traffic created needs two scrapes for rate() to see it (a series
            # first written by the traffic, not by the first chat, may lag a scrape behind).
            for metric in (
                "ferry_llm_requests_finished_total",
                "ferry_llm_inter_token_latency_seconds_count",
            ):
                wait_until(
                    lambda m=metric: scraped_total(prom.url, f"min(count_over_time({m}[1m]))") >= 2,
                    30,
                    f"every {metric} series scraped twice",
                )
            failures = []
            for query in dashboard_queries("ferry-llm.json"):
                expr = substitute(query.expr, LLM_MODEL, "5m")
                if not finite_values(instant_query(prom.url, expr)):
                    failures.append(f"{query.panel} / {query.legend}: {expr}")
            assert not failures, "\n".join(failures)


def _triton_layout():
    from ferry.bench.triton_env import DEFAULT_VENV, TritonLayout

    layout = TritonLayout(DEFAULT_VENV)
    # `make test` builds it first (bench/triton_env.py).
    assert layout.is_built(), "CPU Triton not built: run `make test` (bench/triton_env.py)"
    return layout


def test_triton_dashboard_queries_return_data(tmp_path):
    from ferry.bench.processes import triton_server
    from ferry.exporters.triton_repo import Batching, write_repository

    layout = _triton_layout()
    repository = tmp_path / "repo"
    write_repository(
        DEFAULT_MODEL_DIR, repository, "python", Batching(max_batch_size=32), name=TRITON_MODEL
    )
    with triton_server(repository, tmp_path, layout) as triton:
        model = default_model_config(
            name="via-triton",
            backend={
                "kind": "triton",
                "url": triton.url_for("http"),
                "protocol": "http",
                "model": TRITON_MODEL,
            },
            timeout_s=20,
        )
        with ferry_server([model]) as ferry:
            targets = {
                "ferry": ferry.url.removeprefix("http://"),
                "triton": f"127.0.0.1:{triton.metrics_port}",
            }
            with prometheus_server(targets, tmp_path) as prom:
                wait_until(
                    lambda: scraped_total(prom.url, "sum(up)") == 2, 30, "both targets scraped"
                )

                def worker(seed: int) -> list[int]:
                    with httpx.Client(base_url=ferry.url, timeout=60) as client:
                        body = {"model": "via-triton", "inputs": ["a sentence"] * (1 + seed % 3)}
                        return [client.post("/predict", json=body).status_code for _ in range(8)]

                def drive_and_wait_for_scrape() -> float:
                    before = scraped_total(prom.url, "sum(nv_inference_request_success)")
                    with ThreadPoolExecutor(4) as pool:
                        codes = [c for codes in pool.map(worker, range(4)) for c in codes]
                    assert set(codes) == {200}, codes
                    wait_until(
                        lambda: (
                            scraped_total(prom.url, "sum(nv_inference_request_success)") > before
                        ),
                        30,
                        "Triton's counters scraped after the traffic",
                    )
                    return before

                # Two rounds, each seen by a scrape: rate() then has an increase inside its
                # window whatever the scrape timing (ratios of two zero rates would be NaN).
                drive_and_wait_for_scrape()
                drive_and_wait_for_scrape()
                failures, skipped = [], []
                for query in dashboard_queries("ferry-triton.json"):
                    if "nv_gpu_" in query.expr:
                        skipped.append(query.panel)  # a CPU-only Triton has no DCGM metrics
                        continue
                    expr = substitute(query.expr, TRITON_MODEL, "5m")
                    if not finite_values(instant_query(prom.url, expr)):
                        failures.append(f"{query.panel} / {query.legend}: {expr}")
                assert not failures, "\n".join(failures)
                assert set(skipped) == {"GPU utilisation", "GPU memory"}
