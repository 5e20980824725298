"""/metrics content negotiation and HEAD on GET routes, against a running server."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from ferry.bench.server_process import DEFAULT_MODEL

pytestmark = pytest.mark.integration


def test_metrics_speak_openmetrics_when_asked(kserve):
    accept = "application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5"
    response = httpx.get(f"{kserve.url}/metrics", headers={"Accept": accept}, timeout=10)
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")
    families = {f.name for f in text_string_to_metric_families(response.text)}
    assert "ferry_requests" in families and "ferry_queue_wait_seconds" in families

    plain = httpx.get(f"{kserve.url}/metrics", timeout=10)
    assert plain.headers["content-type"].startswith("text/plain")
    assert "# EOF" not in plain.text


@pytest.mark.parametrize(
    "path",
    ["/metrics", "/health", "/health/ready", "/v1/models", f"/v2/models/{DEFAULT_MODEL}/config"],
)
def test_head_answers_like_get_without_a_body(kserve, path):
    head = httpx.head(f"{kserve.url}{path}", timeout=10)
    get = httpx.get(f"{kserve.url}{path}", timeout=10)
    assert head.status_code == get.status_code == 200
    assert head.headers["content-type"] == get.headers["content-type"]
    assert head.content == b""
