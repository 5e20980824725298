"""Our own Prometheus for the dashboard and alert tests, a `ManagedProcess` like Ferry's."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import yaml

from ferry.bench.processes import ManagedProcess, free_port, http_ok, running


def prometheus_config(targets: dict[str, str], rule_files: list[Path], scrape_s: float = 1) -> str:
    config = {
        "global": {"scrape_interval": f"{scrape_s}s", "evaluation_interval": f"{scrape_s}s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [target]}]}
            for job, target in targets.items()
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


@contextlib.contextmanager
def prometheus_server(
    targets: dict[str, str], workdir: Path, rule_files: list[Path] | None = None
) -> Iterator[ManagedProcess]:
    """Our own Prometheus on loopback (never a system service): a free port, a temp data dir.

    `targets`: job name -> host:port, scraped every second.
    """
    binary = shutil.which("prometheus")
    if binary is None:
        raise FileNotFoundError("prometheus is missing: run `bash tools/install_prometheus.sh`")
    port = free_port()
    config = workdir / f"prometheus-{port}.yml"
    config.write_text(prometheus_config(targets, rule_files or []))
    url = f"http://127.0.0.1:{port}"
    command = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / f'prometheus-data-{port}'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
    ]
    log = workdir / f"prometheus-{port}.log"
    ready = http_ok(f"{url}/-/ready")
    prometheus = ManagedProcess("prometheus", command, log, ready, url, cwd=workdir)
    with running(prometheus, timeout_s=30):
        yield prometheus
