"""The engine process's LLM admission: every API process's requests, counted in one place.

A request's generations are admitted together under a ticket (wire.Admit), or refused together.
Each holds its slot from then until its task in the engine process has ended, past the engine's
own cleanup: the engine never holds more than was admitted, so it never refuses an admitted
generation, and a request never gets some of its choices.
"""

from __future__ import annotations

from ferry.llm.base import LLMEngine
from ferry.server.openai.admission import Admission

Key = tuple[bytes, int]  # (API process, ticket)


class Tickets:
    def __init__(self) -> None:
        self._admission = Admission()
        self._unstarted: dict[Key, tuple[str, int]] = {}  # ticket -> (LLM, slots not yet used)

    def admit(self, key: Key, engine: LLMEngine, count: int) -> None:
        """EngineOverloaded: none of the `count` may start."""
        self._admission.take(engine.name, count, engine.max_concurrent_generations)
        self._unstarted[key] = (engine.name, count)

    def start(self, key: Key) -> bool:
        """One of the ticket's generations starts: False if the ticket has no slot left (or was
        never admitted here: a previous engine process admitted it)."""
        name, left = self._unstarted.get(key, ("", 0))
        if not left:
            return False
        self._unstarted[key] = (name, left - 1)
        return True

    def end(self, name: str) -> None:
        """A started generation's task has ended: its slot is free."""
        self._admission.free(name, 1)

    def release(self, key: Key) -> None:
        """No more generations start under the ticket: the slots it left unused are free."""
        name, left = self._unstarted.pop(key, ("", 0))
        if left:
            self._admission.free(name, left)

    def release_all(self, peer: bytes) -> None:
        """An API process exited: its tickets are released (its generations are aborted)."""
        for key in [key for key in self._unstarted if key[0] == peer]:
            self.release(key)
