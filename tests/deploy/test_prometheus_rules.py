"""promtool on the Prometheus config, the alert rules and their unit tests."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.deploy.deploy_support import (
    DEPLOY,
    PROMETHEUS_SERIES,
    TRITON_METRICS,
    ferry_series_names,
    metric_names,
)

pytestmark = pytest.mark.system

PROM = DEPLOY / "prometheus"
needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool missing: run `bash tools/install_prometheus.sh`",
)


def promtool(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@needs_promtool
def test_promtool_check_config():
    promtool("check", "config", str(PROM / "prometheus.yml"))


@needs_promtool
def test_promtool_check_rules():
    promtool("check", "rules", str(PROM / "alerts.yml"))


@needs_promtool
def test_promtool_test_rules():
    tests = sorted((PROM / "tests").glob("*.yml"))
    assert tests
    out = promtool("test", "rules", *map(str, tests)).stdout
    assert "SUCCESS" in out


def _alerts() -> list[dict]:
    groups = yaml.safe_load((PROM / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_every_alert_has_a_unit_test():
    tested = set()
    for path in (PROM / "tests").glob("*.yml"):
        for case in yaml.safe_load(path.read_text())["tests"]:
            tested |= {t["alertname"] for t in case.get("alert_rule_test", []) if t["exp_alerts"]}
    assert {a["alert"] for a in _alerts()} == tested


def test_alerts_the_issue_asks_for_exist():
    exprs = {a["alert"]: a["expr"] for a in _alerts()}
    assert "ferry_queue_depth / ferry_queue_capacity" in exprs["FerryQueueSaturated"]
    assert 'status=~"5.."' in exprs["FerryHighErrorRate"]
    assert "ferry_request_duration_seconds_bucket" in exprs["FerryLatencyObjective"]
    assert "ferry_model_ready == 0" in exprs["FerryModelNotReady"]
    assert 'up{job="ferry"} == 0' in exprs["FerryTargetDown"]
    refused = 'ferry_connections_refused_total{reason="too_many_connections"}'
    assert refused in exprs["FerryShedding"]


def test_alerts_use_only_exported_metrics():
    known = ferry_series_names() | TRITON_METRICS | PROMETHEUS_SERIES
    for alert in _alerts():
        names = metric_names(alert["expr"])
        assert names and names <= known, f"{alert['alert']}: {names - known}"
        assert alert["labels"]["severity"] in {"warning", "critical"}
        assert alert["annotations"]["summary"]


def test_compose_prometheus_scrapes_ferry_and_triton():
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in config["scrape_configs"]}
    assert jobs["ferry"] == ["ferry:8000"]
    assert jobs["triton"] == ["triton:8002"]
    assert config["rule_files"] == ["alerts.yml"]
