"""The call reader: any split of the model's text gives the same calls and text, which are what
the whole text gives (the answer that is not streamed), cut calls included."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferry.server.openai.tool_stream import read_calls

pytestmark = pytest.mark.unit

CALLS = (
    '<tool_call>{"name":"get_weather","arguments":{"city":"}</tool_call>"}}</tool_call>'
    '<tool_call>{"name":"get_time","arguments":{}}</tool_call>'
)


def replay(text: str, cuts: list[int], text_allowed: bool) -> tuple[str, list[tuple[str, str]]]:
    bounds = [0, *sorted(cuts), len(text)]
    return read_calls([text[a:b] for a, b in itertools.pairwise(bounds)], text_allowed)


@given(st.lists(st.integers(min_value=0, max_value=len(CALLS)), max_size=12))
def test_calls_come_out_whole_however_the_text_is_split(cuts):
    content, calls = replay(CALLS, cuts, text_allowed=True)
    assert content == ""
    assert calls == [("get_weather", '{"city":"}</tool_call>"}'), ("get_time", "{}")]
    assert (content, calls) == read_calls([CALLS], text_allowed=True)
    assert [json.loads(a) for _, a in calls] == [{"city": "}</tool_call>"}, {}]


@given(st.lists(st.integers(min_value=0, max_value=11), max_size=5))
def test_text_under_auto_streams_as_content(cuts):
    assert replay("Paris, sure.", cuts, text_allowed=True) == ("Paris, sure.", [])


CUT = '<tool_call>{"name":"f","arguments":{"a":1'


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ("Paris", []),
        ("", []),
        ('<tool_call>{"name":"f', []),  # cut inside the name: no call, no markup as content
        (CUT, [("f", '{"a":1')]),  # cut inside the arguments: what was written of them
        (CUT + "}}</tool_c", [("f", '{"a":1}')]),  # cut in the closing tag: arguments whole
        (CUT + "2}", [("f", '{"a":12}')]),
    ],
)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(CUT) + 9), max_size=6))
def test_a_cut_call_reads_the_same_streamed_or_whole(text, calls, cuts):
    content, read = replay(text, [c for c in cuts if c <= len(text)], text_allowed=True)
    assert read == calls and (content, read) == read_calls([text], text_allowed=True)
    assert "<" not in content
