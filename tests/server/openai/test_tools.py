"""The default tool prompt for templates without a tool format, and the call grammar."""

from __future__ import annotations

import json

from ferry.server.openai.grammars import GrammarSpec
from ferry.server.openai.tools import ToolPlan, call_grammar, call_text, render_messages

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


def test_a_template_with_a_tool_format_gets_messages_as_they_are():
    history = [{"role": "assistant", "content": "", "tool_calls": [CALL]}]
    assert render_messages(history, PLAN, template_has_tools=True) == history


def test_the_grammar_allows_text_only_under_auto_and_one_call_without_parallel():
    schemas = [{"type": "object"}]
    assert call_grammar(schemas, True, True).startswith("start: TEXT | calls\ncalls: call+")
    assert call_grammar(schemas, False, False).startswith("start: calls\ncalls: call\n")
