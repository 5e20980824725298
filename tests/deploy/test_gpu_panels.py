"""The overview's GPU panels and the GPU alert, evaluated by promtool on made-up NVML series.

No GPU here, so no real ferry_gpu_* series: promtool's PromQL tests run each dashboard query on
two GPUs' worth of series, shaped as server/gpu_metrics.py exports them.
"""

from __future__ import annotations

import shutil

import pytest
import yaml

from tests.deploy.deploy_support import dashboard_queries, metric_names
from tests.deploy.test_prometheus_rules import promtool

pytestmark = pytest.mark.system

SERIES = {
    # (gpu, metric) -> value, on one instance
    ("0", "ferry_gpu_memory_used_bytes"): 3e9,
    ("0", "ferry_gpu_memory_total_bytes"): 80e9,
    ("0", "ferry_gpu_utilization_ratio"): 0.37,
    ("1", "ferry_gpu_memory_used_bytes"): 1e9,
    ("1", "ferry_gpu_memory_total_bytes"): 24e9,
    ("1", "ferry_gpu_utilization_ratio"): 0.0,
}
LABELS = 'instance="a:8000", job="ferry", uuid="GPU-{gpu}", name="H100", gpu="{gpu}"'


def gpu_queries():
    return [
        q
        for q in dashboard_queries("ferry-overview.json")
        if any(n.startswith("ferry_gpu_") for n in metric_names(q.expr))
    ]


def test_the_overview_shows_every_gpu_metric():
    read = set().union(*(metric_names(q.expr) for q in gpu_queries()))
    assert read == {metric for _, metric in SERIES}


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool missing: run `bash tools/install_prometheus.sh`",
)
def test_gpu_queries_give_one_series_per_gpu(tmp_path):
    tests = []
    for query in gpu_queries():
        (metric,) = metric_names(query.expr)
        expected = [
            {"labels": f'{{instance="a:8000", gpu="{gpu}"}}', "value": value}
            for (gpu, name), value in SERIES.items()
            if name == metric
        ]
        tests.append({"expr": query.expr, "eval_time": "1m", "exp_samples": expected})
    spec = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f"{metric}{{{LABELS.format(gpu=gpu)}}}", "values": f"{value!r}x3"}
                    for (gpu, metric), value in SERIES.items()
                ],
                "promql_expr_test": tests,
            }
        ],
    }
    path = tmp_path / "gpu_panels_test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert "SUCCESS" in promtool("test", "rules", str(path)).stdout
