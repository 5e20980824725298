"""The Responses stream's events for one answer, without an engine: a message, or calls."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import ResponseErrorEvent

from ferry.llm.errors import GenerationFailed
from ferry.server.openai.responses import ResponseBuilder, _Events
from ferry.server.openai.responses_protocol import ResponsesRequest
from ferry.server.openai.tool_stream import CallStream

pytestmark = pytest.mark.unit


def events(pieces: list[str], calls: CallStream | None, finish: str = "stop") -> list[dict]:
    request = ResponsesRequest(model="m", input="hi")
    stream = _Events(ResponseBuilder(request, "m"), calls)
    text = stream.opening() + "".join(e for p in pieces for e in stream.text(p))
    text += "".join(stream.closing(finish, (3, len(pieces))))
    bodies = []
    for event in text.split("\n\n")[:-1]:
        kind, data = event.split("\n")
        body = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {body['type']}"
        bodies.append(body)
    assert [b["sequence_number"] for b in bodies] == list(range(len(bodies)))
    return bodies


def test_without_tools_text_starting_with_a_bracket_is_text():
    bodies = events(["<b>", "hi</b>"], None)
    assert [b["type"] for b in bodies][2:5] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    done = bodies[-1]["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0]["text"] == "<b>hi</b>"


def test_calls_become_function_call_items():
    call = '<tool_call>{"name":"f","arguments":{"a":1}}</tool_call>'
    bodies = events([call[:15], call[15:]], CallStream(text_allowed=False))
    kinds = [b["type"] for b in bodies]
    assert "response.output_text.delta" not in kinds
    arguments = "".join(b["delta"] for b in bodies if b["type"].endswith("arguments.delta"))
    assert arguments == '{"a":1}'
    (item,) = bodies[-1]["response"]["output"]
    assert (item["type"], item["name"], item["arguments"], item["status"]) == (
        "function_call",
        "f",
        '{"a":1}',
        "completed",
    )


def test_cut_short_is_incomplete():
    bodies = events(["Paris is"], None, finish="length")
    assert bodies[-1]["type"] == "response.incomplete"
    assert bodies[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert bodies[-1]["response"]["output"][0]["status"] == "incomplete"


def test_a_failure_after_the_start_is_an_error_event_then_a_failed_response():
    stream = _Events(ResponseBuilder(ResponsesRequest(model="m", input="hi"), "m"), None)
    stream.opening()
    error, failed = [
        json.loads(event.split("\n")[1].removeprefix("data: "))
        for event in stream.failed(GenerationFailed("the runtime failed")).split("\n\n")[:-1]
    ]
    # The event's type stays "error" (the error's own type is its code), as the SDK reads it.
    parsed = ResponseErrorEvent.model_validate(error)
    assert (parsed.type, parsed.message) == ("error", "the runtime failed")
    assert parsed.code and parsed.code != "error"
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert (error["sequence_number"], failed["sequence_number"]) == (2, 3)
