"""Tool calling: the grammar a request's tools compile to, the prompt they add, and the calls
read back from what the model wrote.

A call is written as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the Hermes
format vLLM's `hermes` parser reads, and the one Qwen and Hermes templates teach), compact JSON,
several back to back. The grammar enforces it: `required` and a named choice allow
only calls, `auto` allows either a call or text that does not begin with `<`, so whatever call
the model starts is well formed and its arguments follow the tool's `parameters`.

A chat template with no tool format (`tools` never appears in it, as in SmolLM2's) gets the
default: the tools and the call format described in the system message, an assistant's earlier
calls written back as the text above, and `tool` results passed to the template as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ferry.llm.base import Guidance
from ferry.llm.errors import InvalidSampling
from ferry.server.openai.grammars import Grammars, GrammarSpec

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}
_COMPACT = {"whitespace_flexible": False}

DEFAULT_TOOL_PROMPT = (
    "You can call functions. Their signatures, as JSON schemas, are:\n<tools>\n{tools}\n</tools>\n"
    'To call one, answer with <tool_call>{{"name": <function name>, "arguments": <arguments as a'
    " JSON object>}}</tool_call>"
)


@dataclass(frozen=True)
class ToolPlan:
    """A request's tools after checking: what to prompt with and how the answer is read."""

    tools: list[dict[str, Any]]  # OpenAI's tool objects, for the template or the default prompt
    grammar: GrammarSpec  # the calls' grammar, checked by `checked_tools`
    text_allowed: bool  # `auto`: the answer may be text instead of calls
    # Each tool's parameters alone, checked first so that a schema is named by its index.
    parameters: tuple[GrammarSpec, ...] = ()
    guidance: Guidance | None = None  # set by `checked_tools`


async def checked_tools(plan: ToolPlan, grammars: Grammars, engine: str) -> ToolPlan:
    """`plan` with its grammar checked (each tool's parameters first) as `guidance`."""
    grammars.check_alternatives(len(plan.tools), "tools", "tools")
    for spec in plan.parameters:
        await grammars.check(spec, engine)
    return replace(plan, guidance=await grammars.check(plan.grammar, engine))


def plan_tools(request: Any) -> ToolPlan | None:
    """The checked tool settings of a chat request; None when no call may be made."""
    tools, choice = request.tools, request.tool_choice
    if not tools:
        if choice not in (None, "none"):
            raise InvalidSampling("tool_choice", "tool_choice needs tools")
        return None
    if choice == "none":
        return None
    names = [tool.function.name for tool in tools]
    if len(set(names)) != len(names):
        raise InvalidSampling("tools", "tool function names must be unique")
    if choice not in (None, "auto", "required"):
        if choice.function.name not in names:  # a named choice
            raise InvalidSampling(
                "tool_choice", f"tool_choice names {choice.function.name!r}, not in tools"
            )
        names = [choice.function.name]
    schemas, parameters = [], []
    for i, tool in enumerate(tools):
        schema = tool.function.parameters or _NO_ARGUMENTS
        param = f"tools[{i}].function.parameters"
        parameters.append(GrammarSpec("json_schema", json.dumps(schema), param))
        if tool.function.name in names:
            schemas.append(_call_schema(tool.function.name, schema))
    text_allowed = choice in (None, "auto")
    parallel = request.parallel_tool_calls is not False
    grammar = GrammarSpec("lark_grammar", call_grammar(schemas, text_allowed, parallel), "tools")
    dumped = [t.model_dump(exclude_none=True) for t in tools]
    return ToolPlan(dumped, grammar, text_allowed, tuple(parameters))


def _call_schema(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def call_grammar(schemas: list[dict[str, Any]], text_allowed: bool, parallel: bool) -> str:
    """A Lark grammar (llguidance's, with `%json`) for calls, or text not starting with `<`."""
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    schema = {**schema, "x-guidance": _COMPACT}
    rows = [
        "start: TEXT | calls" if text_allowed else "start: calls",
        # No separator between calls: offered a newline after one, a small model writes the
        # same call again; offered `<` or the end, it ends.
        "calls: call+" if parallel else "calls: call",
        f"call: {json.dumps(OPEN)} arguments {json.dumps(CLOSE)}",
        f"arguments: %json {json.dumps(schema)}",
    ]
    if text_allowed:
        rows.append(r"TEXT: /[^<](.|\n)*/")
    return "\n".join(rows)


# -- the prompt ---------------------------------------------------------------------------------


def render_messages(
    messages: list[dict[str, Any]], plan: ToolPlan | None, template_has_tools: bool
) -> list[dict[str, Any]]:
    """Messages for a template without a tool format: the tools in the system message, earlier
    calls as text. A template with one gets them as they are (and `tools=` from the caller)."""
    if template_has_tools:
        return messages
    rendered = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            text = "\n".join(
                call_text(c["function"]["name"], c["function"]["arguments"]) for c in calls
            )
            content = message.get("content") or ""
            message = {"role": message["role"], "content": f"{content}{text}"}
        rendered.append(message)
    if plan is None:
        return rendered
    functions = "\n".join(json.dumps(t["function"]) for t in plan.tools)
    prompt = DEFAULT_TOOL_PROMPT.format(tools=functions)
    if rendered and rendered[0]["role"] == "system":
        first = rendered[0]
        return [{**first, "content": f"{first['content']}\n\n{prompt}"}, *rendered[1:]]
    return [{"role": "system", "content": prompt}, *rendered]


def call_text(name: str, arguments: str) -> str:
    """One call as the model writes it (arguments: JSON text, kept compact)."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = arguments  # a client's malformed history: kept, as a string
    body = json.dumps({"name": name, "arguments": parsed}, separators=(",", ":"))
    return f"{OPEN}{body}{CLOSE}"


# -- the answer ---------------------------------------------------------------------------------


def parse_calls(text: str) -> list[tuple[str, str]] | None:
    """(name, arguments JSON) of each complete call, or None when the text holds none (text
    chosen under `auto`, or a call cut short by max_tokens)."""
    decoder = json.JSONDecoder()
    calls, at = [], 0
    while text.startswith(OPEN, at):
        try:  # whole JSON values, so a closing tag inside a string does not end the call
            call, end = decoder.raw_decode(text, at + len(OPEN))
        except (ValueError, RecursionError):  # RecursionError: deeper than Python reads
            break
        if not text.startswith(CLOSE, end):
            break
        arguments = json.dumps(call["arguments"], separators=(",", ":"), ensure_ascii=False)
        calls.append((call["name"], arguments))
        at = end + len(CLOSE)
    return calls or None
