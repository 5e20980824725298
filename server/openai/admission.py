"""LLM admission: a request's generations (n choices, several prompts) are admitted together or
refused together, before any of them starts, so that a client never gets some of its choices.

In one process the serving layer counts them (`Admission`). An engine in another process
(`api_servers = N`) is shared by every API process, so it admits them itself (`AdmitsGroups`:
server/procs/remote.py, and server/procs/llm_admission.py where the engine keeps the count).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol, runtime_checkable

from ferry.llm.base import GenerationDelta, LLMEngine
from ferry.llm.errors import EngineOverloaded


@dataclass(frozen=True)
class Admitted:
    """A request's admitted generations: each runs through `generate` (LLMEngine.generate's
    signature); `release` once all of them ended frees the ones that never started."""

    generate: Callable[..., AsyncIterator[GenerationDelta]]
    release: Callable[[], None]


@runtime_checkable
class AdmitsGroups(Protocol):
    """An engine that admits a request's generations itself (EngineOverloaded: none)."""

    async def admit(self, count: int) -> Admitted: ...


class Admission:
    """Per LLM, the generations admitted and not yet ended."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def take(self, name: str, count: int, capacity: int) -> None:
        held = self._held.get(name, 0)
        if held + count > capacity:
            # Planning refused requests bigger than the engine: this one fits once others end.
            raise EngineOverloaded(
                f"model {name} is busy: {held} of its {capacity} generations are taken "
                f"and this request needs {count}; retry later"
            )
        self._held[name] = held + count

    def free(self, name: str, count: int) -> None:
        self._held[name] -= count

    def admit(self, engine: LLMEngine, count: int) -> Admitted:
        """`count` generations on an engine in this process."""
        self.take(engine.name, count, engine.max_concurrent_generations)
        return Admitted(engine.generate, partial(self.free, engine.name, count))
