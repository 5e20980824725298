"""Agent and structured-output frameworks, as their users call them, against the real server on
the default chat model (SmolLM2-135M-Instruct). Each test checks what the framework itself
parsed (the pydantic model, the tool call, the usage) and what it sent, never how good the small
model's answer is: the model is only ever asked what fits its format.

The openai SDK's chat API (parse, pydantic tools, streamed calls with usage, tools beside a
response_format) is tested in tests/server/routes/test_openai_structured.py."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from tests.clients.frameworks.shapes import Address, Answer, Person, Role, Usage, Weather

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("offline_clients"),
    # pydantic's notes on litellm's own types, raised while litellm builds a stream chunk.
    pytest.mark.filterwarnings("ignore:Item .* is using the `ReadOnly` qualifier:UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:litellm.*"),
]


@dataclass(frozen=True)
class Client:
    """One framework's way to do one thing: `module.function(url, **options)` of
    tests/clients/frameworks, imported when run (the frameworks take seconds to import)."""

    function: str
    options: dict[str, Any] = field(default_factory=dict)

    def __call__(self, url: str) -> Answer:
        module, function = self.function.rsplit(".", 1)
        run = getattr(importlib.import_module(f"tests.clients.frameworks.{module}"), function)
        return run(url, **self.options)


def clients(**table: Client) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("client", table.values(), ids=list(table))


def check_usage(answer: Answer) -> None:
    if answer.usage is not None:
        assert answer.usage.prompt_tokens > 0 and answer.usage.completion_tokens > 0


# The model each parsed call's arguments must validate against.
ARGUMENTS: dict[str, type[BaseModel]] = {"get_weather": Weather, "final_result": Person}


def check_calls(answer: Answer) -> None:
    assert answer.calls, "the framework parsed no tool call"
    for call in answer.calls:
        ARGUMENTS[call.name].model_validate(call.arguments)


@clients(
    **{
        "openai-responses": Client("openai_sdk.structured"),
        "instructor-tools": Client("instructor_modes.structured", {"mode": "TOOLS"}),
        "instructor-json-schema": Client("instructor_modes.structured", {"mode": "JSON_SCHEMA"}),
        "instructor-responses": Client("instructor_modes.structured", {"mode": "RESPONSES_TOOLS"}),
        "pydantic-ai-tool-output": Client(
            "pydantic_ai_agents.structured", {"api": "chat", "native": False}
        ),
        "pydantic-ai-native-responses": Client(
            "pydantic_ai_agents.structured", {"api": "responses", "native": True}
        ),
        "openai-agents-chat": Client("openai_agents_sdk.structured", {"api": "chat"}),
        "openai-agents-responses": Client("openai_agents_sdk.structured", {"api": "responses"}),
        "litellm": Client("litellm_calls.structured"),
        "litellm-responses": Client("litellm_calls.structured_responses"),
        "langchain-chat": Client("langchain_agents.structured", {"api": "chat"}),
        "langchain-responses": Client("langchain_agents.structured", {"api": "responses"}),
        "dspy": Client("dspy_programs.structured"),
    }
)
def test_structured_output_parses_into_the_nested_model(client, llm_server, wire):
    """The schema goes out as pydantic writes it (`$defs`, `$ref`s: as a json_schema format, a
    Responses text format or a forced tool's parameters) and comes back parsed into the model."""
    answer = client(llm_server.url)
    person = answer.output
    assert isinstance(person, Person), person
    assert isinstance(person.role, Role) and isinstance(person.address, Address)
    assert any('"#/$defs/Role"' in json.dumps(body) for body in wire)
    check_usage(answer)


@clients(
    litellm=Client("litellm_calls.forced"),
    dspy=Client("dspy_programs.forced"),
)
def test_a_forced_tool_call_parses(client, llm_server, wire):
    answer = client(llm_server.url)
    assert wire[0]["tool_choice"] not in (None, "auto")
    check_calls(answer)
    assert answer.calls[0].name == "get_weather"
    check_usage(answer)


@clients(
    **{
        "pydantic-ai": Client("pydantic_ai_agents.streamed"),
        "openai-agents": Client("openai_agents_sdk.streamed"),
        "litellm": Client("litellm_calls.streamed"),
        "langchain": Client("langchain_agents.streamed"),
    }
)
def test_a_streamed_tool_call_reports_usage(client, llm_server, wire):
    """A streamed, forced tool call asking for the usage chunk: the framework reassembles the
    call and reports the server's token counts (those of the same request not streamed)."""
    answer = client(llm_server.url)
    (body,) = wire
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["tool_choice"] not in (None, "auto")
    check_calls(answer)
    assert answer.usage == served_usage(llm_server.url, body)


def served_usage(url: str, body: dict[str, Any]) -> Usage:
    plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    usage = httpx.post(f"{url}/v1/chat/completions", json=plain, timeout=60).json()["usage"]
    return Usage(usage["prompt_tokens"], usage["completion_tokens"])


@clients(
    **{
        "pydantic-ai-native-output": Client("pydantic_ai_agents.beside_format"),
        "openai-agents-chat": Client("openai_agents_sdk.beside_format", {"api": "chat"}),
        "openai-agents-responses": Client("openai_agents_sdk.beside_format", {"api": "responses"}),
        "langchain-provider-strategy": Client("langchain_agents.beside_format", {"api": "chat"}),
        "langchain-provider-strategy-responses": Client(
            "langchain_agents.beside_format", {"api": "responses"}
        ),
        "litellm": Client("litellm_calls.beside_format"),
        "dspy-json-adapter": Client("dspy_programs.beside_format"),
    }
)
def test_a_tool_beside_an_output_format(client, llm_server, wire):
    """Frameworks send a tool and the output's format in one request: the forced call is
    parsed (and run, by the agents), and a run that goes on ends in the format."""
    answer = client(llm_server.url)
    first = wire[0]
    assert first["tools"]
    assert "response_format" in first or "format" in first.get("text", {})
    check_calls(answer)
    assert answer.output is None or isinstance(answer.output, Person)
