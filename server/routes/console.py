"""The console: a page a person opens at /console (static files from server/console/, no build
step, nothing fetched from elsewhere) and the one reading its live view polls.

The page itself is open, as llama-server's web UI is: its files are the same for everyone and
hold nothing but code the wheel ships. Everything it shows comes from routes behind the API key
(/console/live, /v1/models, KServe metadata, inference), which it calls with the key a person
types in when one is asked for. Off with `[server] console = false`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.exceptions import HTTPException

from ferry.server.console_live import read_live
from ferry.server.metrics import ServedSeries
from ferry.server.registry import ModelRegistry
from ferry.server.services import services_of

ASSET_DIR = Path(__file__).resolve().parent.parent / "console"
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
# Only this origin's own files and APIs: a page that could load a script from elsewhere could
# send the key there. No framing (clickjacking), no type sniffing.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; "
    "object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Always revalidated: an upgraded server's page is never mixed with the old one's script.
    "Cache-Control": "no-cache",
}
INDEX = "index.html"

router = APIRouter()


def _assets() -> dict[str, tuple[bytes, str]]:
    """Each file of the console by name, read once: the set is fixed, so a path names one of
    them or nothing (no file system path is ever built from a request)."""
    return {
        path.name: (path.read_bytes(), MEDIA_TYPES[path.suffix])
        for path in sorted(ASSET_DIR.iterdir())
        if path.suffix in MEDIA_TYPES
    }


ASSETS = _assets()


def _asset(name: str) -> Response:
    found = ASSETS.get(name)
    if found is None:
        raise HTTPException(404, f"the console has no file {name!r}")
    body, media_type = found
    return Response(body, media_type=media_type, headers=SECURITY_HEADERS)


@router.get("/console", include_in_schema=False)
async def page() -> Response:
    return _asset(INDEX)


@router.get("/console/live", summary="The console's live reading")
async def live(request: Request) -> dict[str, Any]:
    """Every served model (its kind and limits) and its metrics' totals now: queue depth,
    batches and the requests in them, padding, requests and errors, latency buckets,
    refusals by reason. Two readings make a rate; the console keeps the history."""
    services = services_of(request)
    registry = services.registry
    names = registry.names()
    return {
        "time": time.time(),
        "served": [_summary(registry, e.name, e.task, e.parent) for e in registry.entries()],
        **read_live(ServedSeries(services.metrics.current(), names).collect()),
    }


@router.get("/console/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    return _asset(name)


def _summary(registry: ModelRegistry, name: str, task: str, parent: str | None) -> dict[str, Any]:
    """A served name as the console's forms need it: which form fits (`kind`), and an LLM's
    limits (an encoder's and a graph's are in its KServe configuration)."""
    summary: dict[str, Any] = {"name": name, "task": task, "kind": task, "parent": parent}
    graph = registry.graphs.get(name)
    if graph is not None and graph.signature.images:
        summary["kind"] = "image"
    if task == "chat":
        engine = registry.llm(name).engine
        summary["limits"] = {
            "max_running": engine.max_concurrent_generations,
            "max_context_tokens": engine.max_context_tokens,
            "sampling_options": sorted(engine.sampling_options),
        }
    return summary
