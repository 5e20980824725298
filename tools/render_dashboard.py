"""Render a Grafana dashboard's main panels to a PNG from a Prometheus's data, with matplotlib.

The panels' PromQL is read from the dashboard JSON itself, so the picture shows exactly what
Grafana would. Example, after some traffic against a Ferry that Prometheus scrapes:

    .venv/bin/python tools/render_dashboard.py --prometheus http://127.0.0.1:9090 \
        --minutes 5 --out deploy/grafana/overview.png

Needs matplotlib (not a server dependency): `pip install matplotlib`.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DASHBOARD = ROOT / "deploy/grafana/dashboards/ferry-overview.json"
DEFAULT_PANELS = ("Requests/s", "Request latency", "Batch size", "Queue depth")
# Grafana unit -> (axis label, factor applied to values).
UNITS = {
    "s": ("ms", 1000.0),
    "reqps": ("requests/s", 1.0),
    "ops": ("per second", 1.0),
    "percentunit": ("%", 100.0),
    "bytes": ("MiB", 1 / 2**20),
    "ms": ("ms", 1.0),
    "short": ("", 1.0),
}


def substitute(expr: str, model: str, rate_interval: str) -> str:
    """Grafana's variables -> concrete PromQL (what Grafana does before querying)."""
    return (
        expr.replace("$__rate_interval", rate_interval)
        .replace("${model}", model)
        .replace("$model", model)
    )


def legend(fmt: str, labels: dict[str, str]) -> str:
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()
    return text or ",".join(f"{k}={v}" for k, v in labels.items()) or "value"


def query_range(
    client: httpx.Client, expr: str, start: float, end: float, step: float
) -> list[dict]:
    response = client.get(
        "/api/v1/query_range", params={"query": expr, "start": start, "end": end, "step": step}
    )
    response.raise_for_status()
    body = response.json()
    if body.get("status") != "success":
        raise RuntimeError(f"query failed: {expr}: {body}")
    return body["data"]["result"]


def render(
    prometheus: str,
    dashboard: Path,
    panels: tuple[str, ...],
    out: Path,
    start: float,
    end: float,
    model: str = ".*",
    rate_interval: str = "20s",
    step: float | None = None,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    spec = json.loads(dashboard.read_text())
    by_title = {p["title"]: p for p in spec["panels"]}
    missing = [t for t in panels if t not in by_title]
    if missing:
        raise SystemExit(f"{dashboard}: no panel titled {missing}; have {sorted(by_title)}")
    step = step or max(1.0, (end - start) / 300)
    cols = 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(13, 4.2 * rows), squeeze=False)
    span = time.strftime("%Y-%m-%d %H:%M", time.localtime(start)) + time.strftime(
        " - %H:%M", time.localtime(end)
    )
    fig.suptitle(f"{spec['title']}  ({span}, model=~{model!r})", fontsize=13)
    with httpx.Client(base_url=prometheus, timeout=30) as client:
        for ax, title in zip(axes.flat, panels, strict=False):
            panel = by_title[title]
            axis_label, factor = UNITS.get(panel["fieldConfig"]["defaults"]["unit"], ("", 1.0))
            for target in panel["targets"]:
                expr = substitute(target["expr"], model, rate_interval)
                for series in query_range(client, expr, start, end, step):
                    xs = [datetime.fromtimestamp(float(t)) for t, _ in series["values"]]
                    ys = [float(v) * factor for _, v in series["values"]]
                    ax.plot(xs, ys, label=legend(target.get("legendFormat", ""), series["metric"]))
            ax.set_title(title, fontsize=11, loc="left")
            ax.set_ylabel(axis_label)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8, loc="upper left")
            else:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        for ax in list(axes.flat)[len(panels) :]:
            ax.set_visible(False)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus URL.")
    parser.add_argument("--dashboard", type=Path, default=DEFAULT_DASHBOARD)
    parser.add_argument(
        "--panel",
        action="append",
        dest="panels",
        help=f"Panel title to draw (repeatable; default: {', '.join(DEFAULT_PANELS)}).",
    )
    parser.add_argument("--model", default=".*", help="Value (regex) for $model.")
    parser.add_argument("--minutes", type=float, default=15, help="Window ending now.")
    parser.add_argument("--start", type=float, help="Window start (unix seconds).")
    parser.add_argument("--end", type=float, help="Window end (unix seconds; default now).")
    parser.add_argument(
        "--rate-interval",
        default="20s",
        help="Value for $__rate_interval: at least 4 scrape intervals (default 20s).",
    )
    parser.add_argument("--step", type=float, help="Query resolution in seconds.")
    parser.add_argument("--out", type=Path, default=ROOT / "deploy/grafana/overview.png")
    args = parser.parse_args(argv)
    end = args.end or time.time()
    start = args.start or end - args.minutes * 60
    out = render(
        args.prometheus,
        args.dashboard,
        tuple(args.panels or DEFAULT_PANELS),
        args.out,
        start,
        end,
        model=args.model,
        rate_interval=args.rate_interval,
        step=args.step,
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
