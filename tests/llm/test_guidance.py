"""What the engine's grammar refusals become."""

from __future__ import annotations

import pytest

from ferry.llm.base import Guidance
from ferry.llm.errors import GenerationFailed, GrammarFailed
from ferry.llm.guidance import request_error

pytestmark = pytest.mark.unit

GUIDED = Guidance("json_schema", "{}", "response_format.json_schema.schema")
# What onnxruntime-genai raised for an `anyOf` of 5000 objects, one token in.
ROW_LIMIT = (
    "Error committing tokens: Parser Error: Current row has 5000 items; max is 2000\n<state>..."
)


@pytest.mark.parametrize(
    ("message", "guidance", "expected"),
    [
        (ROW_LIMIT, GUIDED, GrammarFailed),
        ("Error creating grammar: panic: assertion failed", GUIDED, GrammarFailed),
        ("bad allocation", GUIDED, GenerationFailed),
        (ROW_LIMIT, None, GenerationFailed),  # no grammar of the request's: the engine's fault
    ],
)
def test_a_grammar_the_engine_stops_is_the_requests_fault(message, guidance, expected):
    error = request_error(RuntimeError(message), guidance)
    assert type(error) is expected
    if expected is GrammarFailed:
        assert error.field == GUIDED.param and "<state>" not in str(error)
