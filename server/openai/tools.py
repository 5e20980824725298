"""Tool calling: the grammar a request's tools compile to, the prompt they add, and the calls
read back from what the model wrote.

A call is written as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the Hermes
format vLLM's `hermes` parser reads, and the one Qwen and Hermes templates teach), compact JSON,
several back to back. The grammar enforces it: `required` and a named choice allow
only calls, `auto` allows either a call or text that does not begin with `<` (with a JSON
`response_format`, text in that format), so whatever call the model starts is well formed and
its arguments follow the tool's `parameters`. `none` gives the plain request, format included.

A chat template with no tool format (`tools` never appears in it, as in SmolLM2's) gets the
default: the tools and the call format described in the system message, an assistant's earlier
calls written back as the text above, and `tool` results passed to the template as they are.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, replace
from typing import Any

from ferry.llm.base import Guidance
from ferry.llm.errors import InvalidSampling
from ferry.server.openai.grammars import Grammars, GrammarSpec
from ferry.server.openai.strict import check_strict

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


def plan_tools(request: Any, answer: GrammarSpec | None = None) -> ToolPlan | None:
    """The checked tool settings of a chat request; None when no call may be made. `answer`:
    the JSON schema guidance of its `response_format`, which text chosen under `auto` follows."""
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
        if tool.function.strict:
            check_strict(schema, param)
        # Each tool alone is checked first (`checked_tools`), so a schema that cannot compile
        # is named by its index.
        parameters.append(GrammarSpec("json_schema", json.dumps(schema), param))
        if tool.function.name in names:
            schemas.append(_call_schema(i, tool.function.name, schema))
    text_allowed = choice in (None, "auto")
    parallel = request.parallel_tool_calls is not False
    grammar = GrammarSpec(
        "lark_grammar", call_grammar(schemas, text_allowed, parallel, answer), "tools"
    )
    dumped = [t.model_dump(exclude_none=True) for t in tools]
    return ToolPlan(dumped, grammar, text_allowed, tuple(parameters))


def _call_schema(index: int, name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """One call: its name, and arguments following the tool's parameters. A schema with local
    `$ref`s (pydantic's `$defs`, recursion to `#`) is moved whole under the combined schema's
    `$defs` as `tool<index>`, with each such ref rebased there, so that it still resolves."""
    key = f"tool{index}"
    arguments, defs = parameters, None
    rebased = _rebased(parameters, key)
    if rebased != parameters:  # it has local refs
        arguments, defs = {"$ref": f"#/$defs/{key}"}, {key: rebased}
    schema = {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    return schema if defs is None else {**schema, "$defs": defs}


# Keys whose values are data, not schemas (a `$ref` in them is not a reference), and those whose
# values map any name (`default` included) to a schema.
_DATA_KEYS = frozenset({"const", "enum", "default", "examples"})
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions"})


def _rebased(schema: Any, key: str, named: bool = False) -> Any:
    """`schema` with each local ref (`#`, `#/x`) turned into `#/$defs/<key>`, `#/$defs/<key>/x`;
    `named`: schema is a map of names to schemas."""
    if isinstance(schema, list):
        return [_rebased(item, key) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if named:
        return {name: _rebased(sub, key) for name, sub in schema.items()}
    rebased = {
        k: v if k in _DATA_KEYS else _rebased(v, key, k in _NAMED_SCHEMAS)
        for k, v in schema.items()
    }
    ref = schema.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        rebased["$ref"] = f"#/$defs/{key}{ref[1:]}"
    return rebased


def call_grammar(
    schemas: list[dict[str, Any]],
    text_allowed: bool,
    parallel: bool,
    answer: GrammarSpec | None = None,
) -> str:
    """A Lark grammar (llguidance's, with `%json`) for calls or, when text is allowed, text not
    starting with `<` (or, with `answer`, JSON following its schema)."""
    defs: dict[str, Any] = {}
    for schema in schemas:  # hoisted to the root, where `#/$defs/...` resolves
        defs.update(schema.get("$defs", {}))
    calls = [{k: v for k, v in s.items() if k != "$defs"} for s in schemas]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = {**schema, **({"$defs": defs} if defs else {}), "x-guidance": _COMPACT}
    rows = [
        f"start: {'TEXT' if answer is None else 'answer'} | calls"
        if text_allowed
        else "start: calls",
        # No separator between calls: offered a newline after one, a small model writes the
        # same call again; offered `<` or the end, it ends.
        "calls: call+" if parallel else "calls: call",
        f"call: {json.dumps(OPEN)} arguments {json.dumps(CLOSE)}",
        f"arguments: %json {json.dumps(schema)}",
    ]
    if text_allowed and answer is None:
        rows.append(r"TEXT: /[^<](.|\n)*/")
    elif text_allowed:
        assert answer is not None and answer.kind == "json_schema"
        rows.append(f"answer: %json {answer.text}")
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


def call_text(name: str, arguments: Any) -> str:
    """One call as the model writes it (arguments: parsed, or JSON text; kept compact)."""
    parsed = arguments
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # a client's malformed history: kept, as a string
            parsed = json.loads(arguments)
    body = json.dumps({"name": name, "arguments": parsed}, separators=(",", ":"))
    return f"{OPEN}{body}{CLOSE}"
