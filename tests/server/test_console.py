"""The console's server side: the live reading taken from the metrics registry, its files (the
ones the page names, with a policy that keeps it to this origin), its key rule and its switch.
The page itself runs in a real browser in test_console_browser.py."""

from __future__ import annotations

import re

import pytest

from ferry.batcher.observer import FormedBatch
from ferry.server.console_live import LATENCY_BOUNDS_S, read_live
from ferry.server.metrics import FerryMetrics
from ferry.server.routes.console import ASSET_DIR, ASSETS
from ferry.server.settings import Settings
from tests.server.inprocess import serving

pytestmark = pytest.mark.unit

KEY = "k3y"


def test_the_reading_adds_up_each_models_series():
    metrics = FerryMetrics()
    observer = metrics.batch_observer("m", "onnxruntime")
    observer.queue_depth(3)
    for size, real in ((4, 30), (2, 16)):
        observer.batch_formed(FormedBatch(size, real, 40, [0.001] * size, 0, size))
    observer.rejected("queue_full")
    metrics.requests.labels("m", "/predict", "200").inc(5)
    metrics.requests.labels("m", "/v2/models/{name}/infer", "400").inc()
    metrics.requests.labels("", "/predict", "404").inc()  # named no served model: no one's
    for seconds in (0.003, 0.2, 50.0):
        metrics.request_duration.labels("m", "/predict").observe(seconds)
    metrics.connection_refused("header_timeout")

    reading = read_live(metrics.registry.collect())
    assert list(reading["models"]) == ["m"]
    m = reading["models"]["m"]
    assert (m["queue_depth"], m["batches"], m["batched_requests"]) == (3, 2, 6)
    assert (m["padding_count"], m["padding_sum"]) == (2, pytest.approx(0.25 + 0.6))
    assert (m["requests"], m["errors"], m["rejections"]) == (6, 1, {"queue_full": 1})
    bounds = reading["latency_bounds_s"]
    assert bounds == LATENCY_BOUNDS_S and len(m["latency"]) == len(bounds) + 1
    assert m["latency"][bounds.index(0.005)] == 1 and m["latency"][bounds.index(0.25)] == 2
    assert m["latency"][-2:] == [2, 3]  # 50 s is past the last bound: in +Inf only
    assert reading["connections_refused"]["header_timeout"] == 1


def test_every_file_the_page_names_is_served_and_no_other_is_shipped():
    named = set()
    for body, _ in ASSETS.values():
        text = body.decode()
        named |= set(re.findall(r'(?:src|href)="/console/([\w.]+)"', text))
        named |= set(re.findall(r'from "\./([\w.]+)"', text))
    assert named == set(ASSETS) - {"index.html"}
    assert {p.name for p in ASSET_DIR.iterdir()} == set(ASSETS)


async def test_the_page_is_open_and_kept_to_this_origin_while_the_reading_needs_the_key():
    async with serving(Settings(api_key=KEY)) as http:
        page = await http.get("/console")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
        script = await http.get("/console/console.js")
        assert script.headers["content-type"].startswith("text/javascript")
        assert (await http.get("/console/nope.js")).status_code == 404
        # No route of the console's: refused, as any path no route claims (401 without a key).
        for outside in ("/console/..%2Fapp.py", "/console/"):
            assert (await http.get(outside)).status_code == 401, outside
        assert (await http.get("/console/live")).status_code == 401
        live = await http.get("/console/live", headers={"Authorization": f"Bearer {KEY}"})
        assert live.status_code == 200
        assert live.json()["served"] == [] and live.json()["models"] == {}


async def test_console_false_serves_none_of_it():
    async with serving(Settings(console=False)) as http:
        for path in ("/console", "/console/console.js", "/console/live"):
            assert (await http.get(path)).status_code == 404, path
