"""Hooks the OpenAI serving layer calls as generations run, for the ferry_llm_* metrics."""

from __future__ import annotations

from typing import Protocol


class GenerationObserver(Protocol):
    """One model's hooks, its metric labels bound once: server/metrics.py implements them with
    ferry_llm_* series. The bodies do nothing, so a subclass observes only what it overrides."""

    def first_token(self, seconds: float) -> None:
        """The first token came `seconds` after the request."""
        return None  # a body: not abstract, so NullObserver can be made

    def token(self, seconds_since_last: float) -> None:
        """A later token (several in one delta share its gap)."""
        return None

    def guided_token(self, seconds_since_last: float) -> None:
        """A token of a generation under a grammar (also counted by `token`)."""
        return None

    def structured(self, kind: str) -> None:
        """A request with constrained output began (kind: see structured.request_kind)."""
        return None

    def finished(self, reason: str, prompt: int, generated: int, seconds: float) -> None:
        """A generation ended: reason is stop | length | abort (client left) | rejected (429)
        | error; `prompt` and `generated` are its token counts."""
        return None


class LLMObserver(Protocol):
    def for_model(self, model: str) -> GenerationObserver:
        """The hooks for a served model name, bound once per request."""
        ...


class NullObserver(GenerationObserver):
    """Observes nothing, for any model."""

    def for_model(self, model: str) -> GenerationObserver:
        return self
