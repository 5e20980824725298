"""A real trace server for the tracing tests: MLflow's tracking server from `.venv-traces`
(tools/install_trace_server.sh), which takes OTLP/HTTP spans at /v1/traces, stores them in
SQLite with their links, and answers a trace's spans over its REST API."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ferry.bench.processes import ManagedProcess, free_port, http_ok, running
from tests.support import waiting

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-traces"
INSTALL = "bash tools/install_trace_server.sh"
EXPERIMENT = "0"  # MLflow's default experiment: spans sent with this header land in it
EMPTY_STORE = VENV / "empty-store.db"
# Its start takes ~30 s of CPU (two processes importing MLflow); a loaded machine stretches it.
START_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Span:
    trace_id: str  # hex
    span_id: str
    parent_id: str | None
    name: str
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace id, span id), hex


class TraceServer(ManagedProcess):
    def __init__(self, workdir: Path) -> None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        store = workdir / "mlflow.db"
        shutil.copyfile(EMPTY_STORE, store)  # migrated once, by the install script
        command = [
            str(VENV / "bin" / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{store}",
            "--default-artifact-root",
            str(workdir / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ]
        # No job workers (huey): a trace store is all the tests need.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        super().__init__(
            "mlflow", command, workdir / "mlflow.log", http_ok(f"{url}/health"), url, env, workdir
        )

    @property
    def otlp_endpoint(self) -> str:
        return f"{self.url}/v1/traces"

    @property
    def exporter_env(self) -> dict[str, str]:
        """What a Ferry process sending here needs: MLflow files spans by an experiment header;
        the batch processor flushes every 100 ms instead of every 5 s."""
        return {
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"x-mlflow-experiment-id={EXPERIMENT}",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }

    def stop(self, grace_s: float | None = None) -> int | None:
        # `mlflow server` runs uvicorn as its child: both go.
        if self.process is not None and self.process.poll() is None:
            for child in _children(self.process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGTERM)
        return super().stop(grace_s)

    def spans(self, trace_id: str) -> list[Span]:
        """The spans stored for a trace (hex id); [] while none are."""
        answer = httpx.get(
            f"{self.url}/ajax-api/3.0/mlflow/traces/get",
            params={"trace_id": f"tr-{trace_id}"},
            timeout=10,
        )
        if answer.status_code == 404:
            return []
        answer.raise_for_status()
        return [_span(s) for s in answer.json()["trace"].get("spans", [])]

    def wait_for_spans(self, trace_id: str, *names: str) -> list[Span]:
        """The trace's spans once each of `names` is among them (the exporter sends in batches)."""

        def stored() -> list[Span] | None:
            found = self.spans(trace_id)
            return found if set(names) <= {s.name for s in found} else None

        return waiting.wait_until(stored, 30.0, f"spans {names} of trace {trace_id}", 0.2)


def _hex(value: str | None) -> str | None:
    return base64.b64decode(value).hex() if value else None


def _span(stored: dict[str, Any]) -> Span:
    attributes = {a["key"]: _value(a["value"]) for a in stored.get("attributes", [])}
    links = [(_hex(link["trace_id"]), _hex(link["span_id"])) for link in stored.get("links", [])]
    return Span(
        trace_id=_hex(stored["trace_id"]) or "",
        span_id=_hex(stored["span_id"]) or "",
        parent_id=_hex(stored.get("parent_span_id")),
        name=stored["name"],
        attributes=attributes,
        links=links,  # type: ignore[arg-type]  # ids are always present in a link
    )


def _value(value: dict[str, Any]) -> Any:
    """An OTLP AnyValue as JSON; MLflow stores attribute values JSON-encoded in strings."""
    import json

    (kind, raw), *_ = value.items()
    if kind == "string_value":
        with contextlib.suppress(ValueError):
            return json.loads(raw)
    return raw


def _children(pid: int) -> list[int]:
    found = []
    with contextlib.suppress(FileNotFoundError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            found += [*_children(int(child)), int(child)]
    return found


@contextlib.contextmanager
def trace_server() -> Iterator[TraceServer]:
    if not EMPTY_STORE.exists():
        raise RuntimeError(f"no trace server in {VENV}: run `{INSTALL}` (make test does)")
    with (
        tempfile.TemporaryDirectory() as tmp,
        running(TraceServer(Path(tmp)), START_TIMEOUT_S) as s,
    ):
        yield s  # type: ignore[misc]  # running() yields the TraceServer it was given
