"""The real app in this process: create_app's lifespan loads the models, httpx's ASGI transport
carries the requests (no subprocess, no socket), so each test reads the code it checks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI

from ferry.server.app import create_app
from ferry.server.settings import Settings


@asynccontextmanager
async def serving_app(settings: Settings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The app too, for a test that drives its state (its drain)."""
    app = create_app(settings)
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://ferry", timeout=60) as client,
    ):
        yield app, client


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serving_app(settings) as (_, client):
        yield client
