"""Hooks the OpenAI serving layer calls as generations run, for the ferry_llm_* metrics."""

from __future__ import annotations

from typing import Protocol


class LLMObserver(Protocol):
    """Hooks for LLM metrics; server/metrics.py implements them with ferry_llm_* series."""

    def on_first_token(self, model: str, seconds: float) -> None: ...

    def on_token(self, model: str, seconds_since_last: float) -> None: ...

    def on_structured(self, model: str, kind: str) -> None:
        """A request with constrained output began (kind: see structured.request_kind)."""
        ...

    def on_guided_token(self, model: str, seconds_since_last: float) -> None:
        """A token of a generation under a grammar (also counted by on_token)."""
        ...

    def on_finished(
        self,
        model: str,
        finish_reason: str,  # stop | length | abort (client left) | rejected (429) | error
        prompt_tokens: int,
        completion_tokens: int,
        seconds: float,
    ) -> None: ...


class NullObserver:
    def on_first_token(self, model: str, seconds: float) -> None:
        pass

    def on_token(self, model: str, seconds_since_last: float) -> None:
        pass

    def on_structured(self, model: str, kind: str) -> None:
        pass

    def on_guided_token(self, model: str, seconds_since_last: float) -> None:
        pass

    def on_finished(
        self,
        model: str,
        finish_reason: str,
        prompt_tokens: int,
        completion_tokens: int,
        seconds: float,
    ) -> None:
        pass
