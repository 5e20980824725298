"""What every framework is asked for, in the shapes their users write.

Person is what pydantic writes as `$defs` and `$ref`s (a nested model and an enum). Models are
closed (`extra="forbid"`, so `additionalProperties: false`): an open schema lets a small model
add keys until max_tokens. Prompts are ones SmolLM2 answers within MAX_TOKENS."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ferry.bench.server_process import DEFAULT_LLM

MODEL = DEFAULT_LLM
MAX_TOKENS = 80
PERSON_PROMPT = "Add Ada, an admin from London."
WEATHER_PROMPT = "What is the weather in Paris?"


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Role(enum.Enum):
    admin = "admin"
    guest = "guest"


class Address(Closed):
    city: str = Field(max_length=20)


class Person(Closed):
    name: str = Field(max_length=20)
    role: Role
    address: Address


class Weather(Closed):
    city: str = Field(max_length=20)


@dataclass
class Call:
    """A tool call as the framework parsed it."""

    name: str
    arguments: dict[str, Any]


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Answer:
    """What one run of a framework gave back: its parsed calls, output and reported usage."""

    calls: list[Call] = field(default_factory=list)
    output: Any = None
    usage: Usage | None = None


def weather_tool() -> tuple[Callable[[str], str], list[Call]]:
    """The tool the frameworks run, and its calls: each with the arguments the framework parsed
    from the model's call and passed to the function."""
    calls: list[Call] = []

    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(Call("get_weather", {"city": city}))
        return "sunny"

    return get_weather, calls
