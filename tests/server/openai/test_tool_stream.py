"""The streamed-call reader: any split of the model's text gives the same calls and text."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferry.server.openai.tool_stream import CallStream
from ferry.server.openai.tools import parse_calls

CALLS = (
    '<tool_call>{"name":"get_weather","arguments":{"city":"}</tool_call>"}}</tool_call>'
    '<tool_call>{"name":"get_time","arguments":{}}</tool_call>'
)


def replay(text: str, cuts: list[int], text_allowed: bool) -> tuple[str, list[tuple[str, str]]]:
    stream = CallStream(text_allowed)
    content, calls = "", []
    bounds = [0, *sorted(cuts), len(text)]
    for start, end in itertools.pairwise(bounds):
        for piece in stream.feed(text[start:end]):
            if piece[0] == "text":
                content += piece[1]
            elif piece[0] == "call":
                assert piece[1] == len(calls)
                calls.append((piece[2], ""))
            else:
                name, arguments = calls[piece[1]]
                calls[piece[1]] = (name, arguments + piece[2])
    return content, calls


@given(st.lists(st.integers(min_value=0, max_value=len(CALLS)), max_size=12))
def test_calls_come_out_whole_however_the_text_is_split(cuts):
    content, calls = replay(CALLS, cuts, text_allowed=True)
    assert content == ""
    assert calls == [("get_weather", '{"city":"}</tool_call>"}'), ("get_time", "{}")]
    assert calls == parse_calls(CALLS)
    assert [json.loads(a) for _, a in calls] == [{"city": "}</tool_call>"}, {}]


@given(st.lists(st.integers(min_value=0, max_value=11), max_size=5))
def test_text_under_auto_streams_as_content(cuts):
    assert replay("Paris, sure.", cuts, text_allowed=True) == ("Paris, sure.", [])


@pytest.mark.parametrize("text", ["Paris", '<tool_call>{"name":"f","arguments":{"a":1', ""])
def test_text_or_a_cut_call_holds_no_calls(text):
    assert parse_calls(text) is None
