"""POST /v1/responses through the real `openai` SDK (`client.responses.*`) against a running
Ferry on the real default chat model (SmolLM2-135M-Instruct): text and message input,
instructions, streaming events, function tools and `text.format`; stateless."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from tests.server.routes.conftest import SMOL as MODEL

pytestmark = pytest.mark.integration

PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": PARAMETERS,
}
QUESTION = "What is the weather in Paris?"


class Capital(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=20)
    country: str = Field(max_length=20)


SCHEMA = {**Capital.model_json_schema(), "additionalProperties": False}


def args(**overrides):
    return {"model": MODEL, "max_output_tokens": 40, "temperature": 0, **overrides}


def test_text_input_with_instructions(smol_client):
    response = smol_client.responses.create(
        **args(max_output_tokens=5),
        input="What is the capital of France?",
        instructions="Answer in one word.",
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.output_text
    assert response.status == "incomplete"  # 5 tokens: cut by max_output_tokens
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 5
    # The instructions reached the prompt as its system message.
    plain = smol_client.responses.create(
        **args(max_output_tokens=1), input="What is the capital of France?"
    )
    assert response.usage.input_tokens != plain.usage.input_tokens


def test_parse_with_message_input(smol_client):
    response = smol_client.responses.parse(
        **args(),
        input=[{"role": "user", "content": "What is the capital of France?"}],
        text_format=Capital,
    )
    assert isinstance(response.output_parsed, Capital)
    jsonschema.validate(json.loads(response.output_text), SCHEMA)
    assert response.status == "completed"


def test_stream_events_in_order(smol_client):
    with smol_client.responses.stream(
        **args(), input="What is the capital of France?", text_format=Capital
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text
    jsonschema.validate(json.loads(final.output_text), SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
def test_function_tools(smol_client, stream):
    request = args(input=QUESTION, tools=[WEATHER], tool_choice="required")
    if stream:
        with smol_client.responses.stream(**request) as events:
            kinds = [e.type for e in events]
            response = events.get_final_response()
        assert "response.function_call_arguments.delta" in kinds
        assert "response.function_call_arguments.done" in kinds
    else:
        response = smol_client.responses.create(**request)
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), PARAMETERS)


@pytest.mark.parametrize("tool_choice", ["auto", "required", "none"])
def test_function_tools_with_a_text_format(smol_client, tool_choice):
    """A tool and `text.format` together: a call, or a message in the format (tool_choice)."""
    response = smol_client.responses.create(
        **args(input="What is the capital of France?", max_output_tokens=60),
        tools=[WEATHER],
        tool_choice=tool_choice,
        text={"format": {"type": "json_schema", "name": "capital", "schema": SCHEMA}},
    )
    (item,) = response.output
    if item.type == "function_call":
        assert tool_choice != "none" and item.name == "get_weather"
        jsonschema.validate(json.loads(item.arguments), PARAMETERS)
    else:
        assert tool_choice != "required"
        jsonschema.validate(json.loads(response.output_text), SCHEMA)


def test_a_call_cut_by_max_output_tokens_is_incomplete_streamed_or_not(smol_client):
    """The call's arguments so far, in an incomplete item of an incomplete response, alike."""
    request = args(input=QUESTION, tools=[WEATHER], tool_choice="required", max_output_tokens=17)
    response = smol_client.responses.create(**request)
    (call,) = response.output
    assert response.status == "incomplete" and call.status == "incomplete"
    with smol_client.responses.stream(**request) as events:
        done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.name, i.arguments, i.status) for i in done] == [
        (call.name, call.arguments, "incomplete")
    ]


def test_function_call_output_round_trip(smol_client):
    first = smol_client.responses.create(
        **args(input=QUESTION, tools=[WEATHER], tool_choice="required")
    )
    call = first.output[0]
    items = [
        {"role": "user", "content": QUESTION},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 degrees"},
    ]
    answer = smol_client.responses.create(
        **args(max_output_tokens=8), input=items, tools=[WEATHER], tool_choice="none"
    )
    assert answer.output[0].type == "message" and answer.output_text
    # The call and its output reached the prompt through the template.
    without = smol_client.responses.create(
        **args(max_output_tokens=1), input=QUESTION, tools=[WEATHER], tool_choice="none"
    )
    assert answer.usage.input_tokens > without.usage.input_tokens + 10


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"truncation": "auto"}, "truncation"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        # An item type Ferry does not take is named as the item, not as `input` being no string.
        ({"input": [{"role": "user", "content": "hi"}, {"type": "reasoning"}]}, "input[1]"),
        ({"input": [{"type": "function_call", "call_id": "c"}]}, "input[0]"),
        ({"input": 5}, "input"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
        ({"metadata": {"k": "v" * 513}}, "metadata"),
        (
            {
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "x",
                        "schema": {"type": "object", "properties": {"a": {"not": {}}}},
                    }
                }
            },
            "text.format.schema.properties.a",
        ),
        (  # strict: the schema must be closed, as OpenAI requires
            {
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "x",
                        "strict": True,
                        "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
                    }
                }
            },
            "text.format.schema",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "name": "bad",
                        "parameters": {"type": "object", "properties": {"x": {"not": {}}}},
                    }
                ]
            },
            "tools[0].parameters.properties.x",
        ),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(smol_client, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        smol_client.responses.create(**args(max_output_tokens=5), input="hi", extra_body=extra)
    assert info.value.body["param"] == param


def test_the_default_values_of_unsupported_fields_are_served(smol_client):
    defaults = {"truncation": "disabled", "service_tier": "auto", "text": {"verbosity": "medium"}}
    metadata = {f"k{i}": "v" * 512 for i in range(16)}
    response = smol_client.responses.create(
        **args(max_output_tokens=1), input="hi", metadata=metadata, extra_body=defaults
    )
    assert response.status in ("completed", "incomplete")


def test_oversized_instructions_are_named_as_instructions(smol_client, smol_server):
    limit = 100_000  # max_chars_per_text's default
    with pytest.raises(openai.BadRequestError) as info:
        smol_client.responses.create(
            **args(max_output_tokens=1), input="hi", instructions="x" * (limit + 1)
        )
    assert info.value.body["param"] == "instructions"
