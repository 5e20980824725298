"""Write Ferry's Grafana dashboards (overview, LLM, Triton) as JSON from the panel lists.

The JSON under `dashboards/` is generated: edit the panels (overview_panels.py, llm_panels.py,
triton_panels.py, made of dashboard_kit.py), then run
`.venv/bin/python deploy/grafana/build_dashboards.py`; tests/deploy checks the two agree and that
every query uses only metrics Ferry (server/metrics.py) or Triton export.

Queries use `$model` (a multi-value variable, so always `=~`) and `$__rate_interval`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The panel modules sit beside this script, which runs as a file (make dashboards, the tests).
sys.path.insert(0, str(HERE))

from dashboard_kit import DATASOURCE, GENERATION_TOKENS, MODEL_READY, Panel  # noqa: E402
from llm_panels import LLM  # noqa: E402
from overview_panels import OVERVIEW  # noqa: E402
from triton_panels import SUCCESS, TRITON  # noqa: E402

DASHBOARD_DIR = HERE / "dashboards"


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    model_metric: str  # label_values() source for the $model variable
    panels: tuple[Panel, ...]


DASHBOARDS = (
    Dashboard(
        "ferry-overview",
        "Ferry / Overview",
        "Traffic, errors, latency and the micro-batcher of every model Ferry serves.",
        MODEL_READY,
        OVERVIEW,
    ),
    Dashboard(
        "ferry-llm",
        "Ferry / LLM",
        "Token-level latency and throughput of /v1/chat/completions, by model and LoRA adapter.",
        GENERATION_TOKENS,  # adapters appear here, not in the engine gauges
        LLM,
    ),
    Dashboard(
        "ferry-triton",
        "Ferry / Triton",
        "Triton Inference Server behind Ferry: nv_inference_* and GPU metrics from :8002/metrics.",
        SUCCESS,
        TRITON,
    ),
)


def panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict:
    height = 4 if panel.kind == "stat" else 8
    out = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": expr,
                "legendFormat": legend,
                **({"format": "heatmap"} if panel.kind == "heatmap" else {}),
                **({"exemplar": True} if panel.exemplars else {}),
            }
            for i, (legend, expr) in enumerate(panel.targets)
        ],
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
    }
    if panel.kind == "stat":
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"}
    if panel.kind == "heatmap":
        out["options"] = {"calculate": False, "yAxis": {"unit": "short"}}
    out.update(panel.extra)
    return out


def dashboard_json(dash: Dashboard) -> dict:
    panels, x, y, row_h = [], 0, 0, 0
    for i, panel in enumerate(dash.panels, start=1):
        if x + panel.width > 24:
            x, y, row_h = 0, y + row_h, 0
        panels.append(panel_json(panel, i, x, y))
        height = panels[-1]["gridPos"]["h"]
        x, row_h = x + panel.width, max(row_h, height)
    return {
        "uid": dash.uid,
        "title": dash.title,
        "description": dash.description,
        "tags": ["ferry"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {"text": "Prometheus", "value": "prometheus"},
                },
                {
                    "name": "model",
                    "label": "Model",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "query": {
                        "query": f"label_values({dash.model_metric}, model)",
                        "refId": "model",
                    },
                    "definition": f"label_values({dash.model_metric}, model)",
                    "refresh": 2,
                    "multi": True,
                    "includeAll": True,
                    "allValue": ".*",
                    "current": {"text": "All", "value": "$__all"},
                },
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def render_all() -> dict[str, str]:
    """File name -> JSON text, for every dashboard."""
    return {f"{d.uid}.json": json.dumps(dashboard_json(d), indent=2) + "\n" for d in DASHBOARDS}


def main() -> int:
    DASHBOARD_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in render_all().items():
        (DASHBOARD_DIR / name).write_text(text)
        print(f"wrote {DASHBOARD_DIR / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
