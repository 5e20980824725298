"""`response_format` and vLLM's `guided_*` extras as one grammar to check (`grammars.py`).

JSON answers are compact: Ferry adds llguidance's `"x-guidance": {"whitespace_flexible": false}`
to a schema that sets no whitespace option itself, because free whitespace lets a small model
pad an answer with newlines until `max_tokens` (OpenAI's own JSON answers carry none either).
"""

from __future__ import annotations

import json
from typing import Any

from ferry.llm.errors import InvalidSampling
from ferry.server.openai.grammars import GrammarSpec
from ferry.server.openai.json_depth import check_json_depth
from ferry.server.openai.strict import check_strict

# vLLM's extras, in the order vLLM reads them.
GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
_COMPACT = {"whitespace_flexible": False}


def json_schema_guidance(schema: Any, param: str) -> GrammarSpec:
    """A schema (a dict, or JSON text) as a compact-JSON grammar."""
    if isinstance(schema, str):
        check_json_depth(schema, param)
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise InvalidSampling(param, f"{param} is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise InvalidSampling(param, f"{param} must be a JSON schema object")
    options = schema.get("x-guidance")
    if not isinstance(options, dict) or not options:
        schema = {**schema, "x-guidance": _COMPACT}
    return GrammarSpec("json_schema", json.dumps(schema), param)


def output_guidance(request: Any) -> tuple[GrammarSpec, str] | None:
    """The request's one output constraint and the parameter that asked for it, or None.
    Two kinds at once are a 400 naming the second (vLLM allows only one as well)."""
    found: list[tuple[GrammarSpec, str]] = []
    response_format = request.response_format
    if response_format is not None and response_format.type != "text":
        found.append(_response_format(response_format))
    for name in GUIDED:
        value = getattr(request, name)
        if value is not None:
            if found:
                raise InvalidSampling(name, f"{name} cannot be combined with {found[0][1]}")
            found.append((_guided(name, value), name))
    return found[0] if found else None


def request_kind(request: Any, tools: bool) -> str | None:
    """The metrics label of a request's output constraint: from a fixed set, never client text."""
    if tools:
        return "tools"
    response_format = request.response_format
    if response_format is not None and response_format.type != "text":
        return str(response_format.type)
    return next((name for name in GUIDED if getattr(request, name) is not None), None)


def _response_format(response_format: Any) -> tuple[GrammarSpec, str]:
    if response_format.type == "json_object":
        return json_schema_guidance({"type": "object"}, "response_format"), "response_format"
    spec = response_format.json_schema
    param = "response_format.json_schema"
    if spec is None:
        raise InvalidSampling(param, "response_format of type json_schema needs json_schema")
    if spec.schema_ is None:
        raise InvalidSampling(f"{param}.schema", f"{param}.schema is required")
    if spec.strict:
        check_strict(spec.schema_, f"{param}.schema")
    return json_schema_guidance(spec.schema_, f"{param}.schema"), "response_format"


def _guided(name: str, value: Any) -> GrammarSpec:
    if name == "guided_json":
        return json_schema_guidance(value, name)
    if name == "guided_regex":
        return GrammarSpec("regex", value, name)
    if name == "guided_choice":  # made a Lark grammar by the checker, off the event loop
        return GrammarSpec("choice", json.dumps(value), name)
    return GrammarSpec("any_grammar", value, name)
