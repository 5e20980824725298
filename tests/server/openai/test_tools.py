"""The default tool prompt for templates without a tool format, and the call grammar (checked
with llguidance on the default model's vocabulary)."""

from __future__ import annotations

import json

import pytest

from ferry.server.openai.grammars import GrammarSpec
from ferry.server.openai.protocol import ChatCompletionRequest
from ferry.server.openai.structured import json_schema_guidance
from ferry.server.openai.tool_models import ToolParam
from ferry.server.openai.tools import (
    ToolPlan,
    call_grammar,
    call_text,
    plan_tools,
    render_messages,
)
from tests.server.routes.conftest import SMOL_DIR

pytestmark = pytest.mark.unit

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
PLAN = ToolPlan(TOOLS, GrammarSpec("lark_grammar", 'start: "x"', "tools"), text_allowed=True)
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}


def test_tools_join_the_system_message_or_open_the_prompt():
    user = {"role": "user", "content": "hi"}
    first = render_messages([user], PLAN, template_has_tools=False)[0]
    assert first["role"] == "system" and json.dumps(TOOLS[0]["function"]) in first["content"]
    system = {"role": "system", "content": "Be brief."}
    merged = render_messages([system, user], PLAN, template_has_tools=False)
    assert len(merged) == 2 and merged[0]["content"].startswith("Be brief.\n\n")


def test_earlier_calls_are_written_back_as_the_model_writes_them():
    history = [{"role": "assistant", "content": "", "tool_calls": [CALL]}]
    (message,) = render_messages(history, None, template_has_tools=False)
    assert message == {
        "role": "assistant",
        "content": '<tool_call>{"name":"f","arguments":{"a":1}}</tool_call>',
    }
    assert call_text("f", '{"a": 1}') == message["content"]
    assert call_text("f", {"a": 1}) == message["content"]  # as chat_messages() parses them


def test_a_template_with_a_tool_format_gets_messages_as_they_are():
    history = [{"role": "assistant", "content": "", "tool_calls": [CALL]}]
    assert render_messages(history, PLAN, template_has_tools=True) == history


def test_the_grammar_allows_text_only_under_auto_and_one_call_without_parallel():
    schemas = [{"type": "object"}]
    assert call_grammar(schemas, True, True).startswith("start: TEXT | calls\ncalls: call+")
    assert call_grammar(schemas, False, False).startswith("start: calls\ncalls: call\n")


# -- tool schemas with `$defs` and `$ref`, checked with llguidance on the default model's vocabulary


@pytest.fixture(scope="module")
def vocabulary():
    from llguidance import LLTokenizer

    return LLTokenizer((SMOL_DIR / "tokenizer.json").read_text())


def accepts(vocabulary, grammar: str, text: str) -> bool:
    from llguidance import LLMatcher

    matcher = LLMatcher(vocabulary, LLMatcher.grammar_from_lark(grammar))
    tokens = vocabulary.tokenize_str(text)
    return matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()


def tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


ROLE = {"$defs": {"Role": {"enum": ["admin", "guest"]}}}
TOOLS_WITH_REFS = [
    # pydantic's shape: the root refers into its own $defs (the same name in two tools)
    tool("person", {**ROLE, "type": "object", "properties": {"role": {"$ref": "#/$defs/Role"}}}),
    tool("group", {**ROLE, "type": "object", "properties": {"role": {"$ref": "#/$defs/Role"}}}),
    # recursion to the root, a pointer into properties, and a property named like a data key
    tool(
        "node",
        {
            "type": "object",
            "properties": {"next": {"$ref": "#"}, "default": {"$ref": "#/properties/next"}},
            "additionalProperties": False,
        },
    ),
]


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        ('<tool_call>{"name":"person","arguments":{"role":"admin"}}</tool_call>', True),
        ('<tool_call>{"name":"group","arguments":{"role":"guest"}}</tool_call>', True),
        ('<tool_call>{"name":"person","arguments":{"role":"boss"}}</tool_call>', False),
        (
            '<tool_call>{"name":"node","arguments":{"next":{"next":{}},"default":{}}}</tool_call>',
            True,
        ),
        ('<tool_call>{"name":"node","arguments":{"next":{"other":1}}}</tool_call>', False),
    ],
)
def test_local_refs_resolve_for_every_tool(vocabulary, text, accepted):
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    request.tools = [ToolParam.model_validate(t) for t in TOOLS_WITH_REFS]
    plan = plan_tools(request)
    assert plan is not None and accepts(vocabulary, plan.grammar.text, text) is accepted


def test_a_response_format_is_the_text_allowed_beside_calls(vocabulary):
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    request.tools = [ToolParam.model_validate(TOOLS_WITH_REFS[0])]
    answer = json_schema_guidance(
        {"type": "object", "properties": {"a": {"type": "integer"}}}, "rf"
    )
    grammar = plan_tools(request, answer).grammar.text
    assert accepts(vocabulary, grammar, '{"a":1}')
    assert accepts(vocabulary, grammar, '<tool_call>{"name":"person","arguments":{}}</tool_call>')
    assert not accepts(vocabulary, grammar, "Paris")
