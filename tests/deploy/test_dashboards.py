"""The Grafana dashboards and provisioning: generated, well-formed, and using real metric names."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import yaml

from tests.deploy.deploy_support import (
    DASHBOARDS,
    DEPLOY,
    PROMETHEUS_SERIES,
    TRITON_METRICS,
    dashboard_queries,
    ferry_series_names,
    load_dashboard,
    metric_names,
)

pytestmark = pytest.mark.system

FERRY_DASHBOARDS = ("ferry-overview.json", "ferry-llm.json")


def _builder():
    spec = importlib.util.spec_from_file_location(
        "build_dashboards", DEPLOY / "grafana" / "build_dashboards.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_committed_json_is_what_the_builder_writes():
    rendered = _builder().render_all()
    assert sorted(rendered) == sorted(p.name for p in DASHBOARDS.glob("*.json"))
    for name, text in rendered.items():
        assert (DASHBOARDS / name).read_text() == text, (
            f"{name} is stale: run .venv/bin/python deploy/grafana/build_dashboards.py"
        )


def test_metric_names_extracted_from_promql():
    expr = (
        "histogram_quantile(0.95, sum by (le, model) "
        '(rate(ferry_queue_wait_seconds_bucket{model=~"a"}[5m])))'
        " / on (model) ferry_queue_capacity or vector(0)"
    )
    assert metric_names(expr) == {"ferry_queue_wait_seconds_bucket", "ferry_queue_capacity"}


@pytest.mark.parametrize("name", FERRY_DASHBOARDS)
def test_ferry_dashboards_query_only_metrics_ferry_exports(name):
    known = ferry_series_names() | PROMETHEUS_SERIES
    for query in dashboard_queries(name):
        unknown = metric_names(query.expr) - known
        assert not unknown, f"{name} / {query.panel}: unknown metrics {unknown}"
        assert metric_names(query.expr), f"{name} / {query.panel}: no metric in {query.expr}"


def test_triton_dashboard_queries_only_triton_metrics():
    for query in dashboard_queries("ferry-triton.json"):
        names = metric_names(query.expr)
        assert names and names <= TRITON_METRICS, f"{query.panel}: {names - TRITON_METRICS}"


def test_llm_dashboard_covers_every_llm_metric():
    """Every ferry_llm_* family server/metrics.py defines has a panel (histograms by bucket)."""
    from ferry.server.metrics import FerryMetrics

    used = set().union(*(metric_names(q.expr) for q in dashboard_queries("ferry-llm.json")))
    queried_as = {"histogram": "_bucket", "counter": "_total", "gauge": ""}
    families = [f for f in FerryMetrics().registry.collect() if f.name.startswith("ferry_llm_")]
    assert len(families) >= 8
    missing = {f"{f.name}{queried_as[f.type]}" for f in families} - used
    assert not missing, f"LLM metrics no panel shows: {missing}"


def test_llm_dashboard_splits_by_model_and_adapter():
    # Adapters are served model names: they show in the $model choices and in per-model series.
    spec = load_dashboard("ferry-llm.json")
    variable = next(v for v in spec["templating"]["list"] if v["name"] == "model")
    assert "ferry_llm_generation_tokens_total" in json.dumps(variable["query"])
    split = {q.panel: q for q in dashboard_queries("ferry-llm.json") if q.legend == "{{model}}"}
    metrics = set().union(*(metric_names(q.expr) for q in split.values()))
    assert {
        "ferry_llm_generation_tokens_total",
        "ferry_llm_time_to_first_token_seconds_bucket",
        "ferry_llm_requests_finished_total",
    } <= metrics
    assert all("by (model)" in q.expr or "by (le, model)" in q.expr for q in split.values())


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS.glob("*.json")))
def test_dashboard_is_well_formed(name):
    spec = load_dashboard(name)
    assert spec["uid"] == name.removesuffix(".json")
    ids = [p["id"] for p in spec["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in spec["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["model"]["multi"] and variables["model"]["allValue"] == ".*"
    for panel in spec["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            # $model is multi-value: an equality matcher would break with "All" or two models.
            assert 'model="$model"' not in target["expr"], panel["title"]


def test_overview_has_the_panels_the_issue_asks_for():
    titles = {p["title"] for p in load_dashboard("ferry-overview.json")["panels"]}
    assert titles >= {
        "Requests/s",
        "Errors by status",
        "Rejections by reason",
        "Request latency",
        "Queue depth",
        "Queue wait",
        "Queue wait p95 by priority",
        "Batch size",
        "Batch size distribution",
        "Padding ratio",
        "Backend time per batch",
        "In-flight requests",
    }


def test_the_shedding_panel_shows_refused_connections_too():
    (panel,) = [
        p
        for p in load_dashboard("ferry-overview.json")["panels"]
        if p["title"] == "Rejections by reason"
    ]
    names = set().union(*(metric_names(t["expr"]) for t in panel["targets"]))
    assert names == {"ferry_rejections_total", "ferry_connections_refused_total"}


def test_provisioning_points_at_the_mounted_dashboards():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    mounts = dict(
        v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"] if v.startswith("./")
    )
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/ferry.yml").read_text())[
        "providers"
    ][0]
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    datasource = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"][0]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    # The dashboards' datasource variable defaults to this data source.
    for name in (p.name for p in DASHBOARDS.glob("*.json")):
        variable = load_dashboard(name)["templating"]["list"][0]
        assert variable["current"]["value"] == datasource["uid"]
    json.dumps(provider)  # plain data, no YAML tags
