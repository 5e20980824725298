"""What the registry and the health routes use of any served model, encoder or plain graph:
its name and settings, its lifecycle and readiness, and the count of requests it refused."""

from __future__ import annotations

from typing import Protocol

from ferry.server.settings import ModelSettings


class ServedModel(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def settings(self) -> ModelSettings: ...
    @property
    def ready(self) -> bool: ...

    async def start(self) -> None: ...

    async def healthy(self) -> bool: ...

    def count_invalid(self) -> None:
        """A request refused by validation, counted with the batcher's own refusals."""

    async def close(self, drain_timeout_s: float) -> None: ...
