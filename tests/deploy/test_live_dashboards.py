"""Every dashboard query, evaluated by a real Prometheus scraping a real Ferry after real traffic.

Needs `prometheus` (bash tools/install_prometheus.sh) and the exported default model (make model).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from ferry.bench.server_process import DEFAULT_MODEL_DIR, default_model_config, ferry_server
from tests.deploy.deploy_support import (
    DEPLOY,
    ROOT,
    dashboard_queries,
    finite_values,
    instant_query,
    metric_names,
    needs_prometheus,
    scraped_total,
)
from tests.gpu import requires_gpu
from tests.server.conftest import API_SERVERS
from tests.support.prometheus import prometheus_server
from tests.support.waiting import wait_until
from tools.render_dashboard import substitute

pytestmark = [pytest.mark.system, needs_prometheus, pytest.mark.timeout(180)]

MODEL = "all-MiniLM-L6-v2"
# Wider than the traffic run, so every rate() sees all of it (Grafana: $__rate_interval).
RATE_INTERVAL = "1m"
URGENT = -10  # one of the default priority_levels
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "ferry",
    "batches",
    "every",
    "request",
]


def predict_texts(i: int) -> list[str]:
    """1-3 texts of 2-40 words: batches mix lengths, so padding is non-zero."""
    return [
        " ".join(WORDS[(i + j) % len(WORDS)] for j in range(2 + (i * 7 + k) % 38))
        for k in range(1 + i % 3)
    ]


def drive_predict(url: str, seconds: float) -> dict[int, int]:
    """Concurrent /predict traffic (one client of 8 urgent) plus some errors; returns responses
    by status code."""
    statuses: dict[int, int] = {}

    def worker(seed: int) -> list[int]:
        codes = []
        with httpx.Client(base_url=url, timeout=30) as client:
            i = seed
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                body = {"inputs": predict_texts(i), "priority": URGENT if seed == 0 else 0}
                codes.append(client.post("/predict", json=body).status_code)
                i += 8
        return codes

    with ThreadPoolExecutor(8) as pool:
        for codes in pool.map(worker, range(8)):
            for code in codes:
                statuses[code] = statuses.get(code, 0) + 1
    with httpx.Client(base_url=url, timeout=30) as client:
        errors = [
            client.post("/predict", json={"model": "no-such-model", "inputs": "x"}),  # 404
            client.post("/predict", json={"inputs": "x", "input_ids": [1]}),  # 422 (schema)
            client.post("/predict", json={"input_ids": [[101, 10**9, 102]]}),  # 422 (rejection)
            client.post("/predict", json={"input_ids": [[101, 10**9, 102]]}),
            client.get("/no/such/route"),  # 404, unmatched route
        ]
    for response in errors:
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
    return statuses


@pytest.fixture(scope="module", params=API_SERVERS)
def overview_run(request, tmp_path_factory):
    """In both modes: with API processes, Prometheus scrapes the one merged /metrics."""
    if not (DEFAULT_MODEL_DIR / "model.onnx").exists():
        pytest.fail(f"{DEFAULT_MODEL_DIR} is missing: run `make model`")
    work = tmp_path_factory.mktemp("overview")
    model = default_model_config(batching={"max_queue_delay_s": 0.005})
    # Keyless clients may not go below priority 0 by default (server/tenancy.py): this trusted
    # test lets everyone, to see the urgent series.
    settings = {"drain_timeout_s": 2, "api_servers": request.param, "priority_keys": ["*"]}
    with ferry_server([model], server=settings) as ferry:
        target = ferry.url.removeprefix("http://")
        rules = [DEPLOY / "prometheus" / "alerts.yml"]
        with prometheus_server({"ferry": target}, work, rules) as prom:
            wait_until(lambda: scraped_total(prom.url, 'up{job="ferry"}') == 1, 30, "first scrape")
            started = time.time()
            statuses = drive_predict(ferry.url, seconds=4)
            assert statuses.get(200, 0) > 50, statuses
            assert statuses.get(422) == 3 and statuses.get(404) == 2, statuses
            # Every series the traffic created needs two scrapes for rate() to see it.
            for metric in ("ferry_requests_total", "ferry_rejections_total"):
                wait_until(
                    lambda m=metric: scraped_total(prom.url, f"min(count_over_time({m}[1m]))") >= 2,
                    30,
                    f"every {metric} series scraped twice",
                )
            yield {"prometheus": prom.url, "ferry": ferry, "statuses": statuses, "start": started}


def overview_queries() -> list:
    """Every overview query; those of ferry_gpu_* have data only on a host with a GPU."""
    return [
        pytest.param(query, marks=[pytest.mark.gpu, requires_gpu])
        if any(name.startswith("ferry_gpu_") for name in metric_names(query.expr))
        else query
        for query in dashboard_queries("ferry-overview.json")
    ]


@pytest.mark.parametrize("query", overview_queries(), ids=lambda q: f"{q.panel}/{q.legend}")
def test_overview_query_returns_data(overview_run, query):
    expr = substitute(query.expr, MODEL, RATE_INTERVAL)
    result = instant_query(overview_run["prometheus"], expr)
    assert result, f"no series for panel {query.panel!r}: {expr}"
    assert finite_values(result), f"only NaN/Inf for panel {query.panel!r}: {expr} -> {result}"


def overview_panel_expr(title: str) -> str:
    """The first query of the overview panel `title`, as Grafana would send it."""
    query = next(q for q in dashboard_queries("ferry-overview.json") if q.panel == title)
    return substitute(query.expr, MODEL, RATE_INTERVAL)


def test_overview_numbers_match_the_traffic(overview_run):
    prom = overview_run["prometheus"]
    errors = instant_query(prom, overview_panel_expr("Errors by status"))
    assert {s["metric"]["status"] for s in errors} == {"404", "422"}
    reasons = instant_query(prom, f'ferry_rejections_total{{model="{MODEL}"}}')
    assert {s["metric"]["reason"]: float(s["value"][1]) for s in reasons} == {"invalid": 2.0}
    sizes = instant_query(prom, f'ferry_batch_size_requests_sum{{model="{MODEL}"}}')
    texts = overview_run["statuses"][200]  # at least one text per 200
    assert float(sizes[0]["value"][1]) >= texts
    mean_batch = instant_query(
        prom,
        f'sum(ferry_batch_size_requests_sum{{model="{MODEL}"}})'
        f' / sum(ferry_batch_size_requests_count{{model="{MODEL}"}})',
    )
    assert float(mean_batch[0]["value"][1]) > 1, "8 concurrent clients should batch"
    by_priority = instant_query(prom, overview_panel_expr("Queue wait p95 by priority"))
    # Every configured level has a series from the start; only those that waited have a p95.
    waited = {s["metric"]["priority"] for s in by_priority if finite_values([s])}
    assert waited == {str(URGENT), "0"}


def test_model_variable_lists_the_served_model(overview_run):
    spec = json.loads((DEPLOY / "grafana/dashboards/ferry-overview.json").read_text())
    variable = next(v for v in spec["templating"]["list"] if v["name"] == "model")
    metric = variable["definition"].removeprefix("label_values(").split(",")[0]
    response = httpx.get(
        f"{overview_run['prometheus']}/api/v1/label/model/values", params={"match[]": metric}
    )
    assert response.json()["data"] == [MODEL]


def test_alert_rules_load_and_stay_quiet_on_a_healthy_ferry(overview_run):
    prom = overview_run["prometheus"]
    groups = httpx.get(f"{prom}/api/v1/rules").json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert {r["name"] for r in rules} >= {
        "FerryQueueSaturated",
        "FerryHighErrorRate",
        "FerryLatencyObjective",
        "FerryModelNotReady",
        "FerryTargetDown",
    }
    time.sleep(1.5)  # one evaluation interval after the traffic
    rules = [
        rule
        for group in httpx.get(f"{prom}/api/v1/rules").json()["data"]["groups"]
        for rule in group["rules"]
    ]
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    # Pending is allowed: every rule has a `for:` of minutes, and a loaded CI machine may well
    # see a slow p99 for a few seconds. Nothing may be firing.
    alerts = httpx.get(f"{prom}/api/v1/alerts").json()["data"]["alerts"]
    assert [a["labels"]["alertname"] for a in alerts if a["state"] == "firing"] == []


def test_render_dashboard_draws_the_overview(overview_run, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "overview.png"
    end = time.time()
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools/render_dashboard.py"),
            "--prometheus",
            overview_run["prometheus"],
            "--start",
            str(overview_run["start"] - 5),
            "--end",
            str(end),
            "--step",
            "1",
            "--rate-interval",
            "5s",
            "--model",
            MODEL,
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 20_000


def test_ferry_drains_and_exits_on_sigterm(overview_run):
    """What the k8s preStop + grace period and compose's stop_grace_period rely on."""
    ferry = overview_run["ferry"]
    started = time.monotonic()
    returncode = ferry.stop(grace_s=30)
    # uvicorn re-raises SIGTERM after a clean shutdown, so -15 is a clean exit too.
    assert returncode in (0, -signal.SIGTERM), ferry.log()
    assert time.monotonic() - started < 10
