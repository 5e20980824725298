"""The bases of every OpenAI request model: a field Ferry does not know is a 400 naming it, as
OpenAI answers ("Unrecognized request argument supplied"), never silently ignored.

Nested objects refuse unknown keys through pydantic (`extra="forbid"`; server/errors.py names the
whole path). A request body may also carry OpenAI parameters Ferry cannot honour: those are
accepted at the values that ask for nothing and refused by name at any other
(`RequestBody.UNSUPPORTED`), so a client that always sends, say, `best_of: 1` still runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from ferry.llm.errors import InvalidSampling


class OpenAIRequestModel(BaseModel):
    """Base for request objects: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")


def neutral(value: Any, values: tuple[Any, ...]) -> bool:
    """`value` asks for nothing: equal to a neutral value and of its type (`false` is not 0)."""
    return any(value == n and type(value) is type(n) for n in values)


class RequestBody(OpenAIRequestModel):
    """Base for a whole request body: `UNSUPPORTED` names OpenAI parameters Ferry cannot honour,
    each with the values that ask for nothing; `WHY` says what to send instead."""

    UNSUPPORTED: ClassVar[Mapping[str, tuple[Any, ...]]] = {}
    WHY: ClassVar[Mapping[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _drop_neutral_unsupported(cls, data: Any) -> Any:
        """Neutral values of UNSUPPORTED parameters are dropped; any other is a 400 naming it.
        Every other unknown key is left for `extra="forbid"` to refuse."""
        if not isinstance(data, dict):
            return data
        asked = [k for k in data if k in cls.UNSUPPORTED and k not in cls.model_fields]
        for name in asked:
            if not neutral(data[name], cls.UNSUPPORTED[name]):
                why = cls.WHY.get(name)
                message = f"{name}: {why}" if why else f"{name} is not supported by this server"
                raise InvalidSampling(name, message)
        return {k: v for k, v in data.items() if k not in asked} if asked else data
