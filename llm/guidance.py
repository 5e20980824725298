"""Constrained decoding on both engines: one grammar check before work, one way to apply it.

Ferry's grammars are llguidance's (JSON schema, regex, Lark with `%json`): onnxruntime-genai
compiles llguidance in, and its Python package compiles the same grammar on the event loop, so
a schema the engine would refuse is a 400 naming its offending part before anything is queued.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from ferry.llm.base import Guidance
from ferry.llm.errors import InvalidSampling

# Subschemas visited when looking for the part that failed: enough for any hand-written schema,
# and a bound on the work a hostile one can ask for on the error path.
_MAX_PARTS = 256
# Keys whose values are subschemas, or maps / lists of them.
_SCHEMA_KEYS = ("items", "additionalProperties", "not", "contains", "propertyNames")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def apply_guidance(target: Any, guidance: Guidance | None) -> None:
    """Set `guidance` on an og.TurnOptions or og.GeneratorParams (both take kind and data).

    enable_ff_tokens (GeneratorParams only) stays off: with it one step may add several tokens,
    and both lanes deliver one token per step."""
    if guidance is not None:
        target.set_guidance(guidance.kind, guidance.data)


def grammar_error(guidance: Guidance) -> str | None:
    """llguidance's reason the grammar cannot be compiled, or None if it can (or if the
    llguidance package is absent: the engine then refuses it when the request starts)."""
    try:
        from llguidance import LLMatcher
    except ImportError:  # pragma: no cover - installed with the cpu extra
        return None
    if guidance.kind == "json_schema":
        grammar = LLMatcher.grammar_from_json_schema(guidance.data)
    elif guidance.kind == "regex":
        grammar = LLMatcher.grammar_from_regex(guidance.data)
    else:
        grammar = LLMatcher.grammar_from_lark(guidance.data)
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    # Its first line: the rest quotes the grammar, which for Ferry's own (tools) is not the
    # client's text.
    return messages[0].strip().splitlines()[0] if is_error else None


def check_guidance(guidance: Guidance, param: str) -> None:
    """InvalidSampling naming `param` (and, for a JSON schema, the path of the subschema that
    fails, e.g. `response_format.json_schema.schema.properties.when`) if it cannot compile."""
    error = grammar_error(guidance)
    if error is None:
        return
    if guidance.kind == "json_schema":
        path = _failing_part(json.loads(guidance.data))
        if path:
            param = f"{param}.{'.'.join(path)}"
    raise InvalidSampling(param, f"{param} cannot be used for constrained decoding: {error}")


def _failing_part(schema: Any) -> list[str]:
    """The deepest subschema that fails on its own (with the root's definitions, so that its
    `$ref`s resolve); [] when only the whole fails."""
    if not isinstance(schema, dict):
        return []
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    deepest: list[str] = []
    for count, (path, part) in enumerate(schema_parts(schema, [])):
        if count >= _MAX_PARTS:
            break
        if not path or not isinstance(part, dict) or len(path) <= len(deepest):
            continue
        alone = json.dumps({**defs, **part})
        if grammar_error(Guidance("json_schema", alone)) is not None:
            deepest = path
    return deepest


def schema_parts(schema: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    """Every subschema with its path, depth first."""
    yield path, schema
    if not isinstance(schema, dict):
        return
    for key in _SCHEMA_KEYS:
        if isinstance(schema.get(key), dict):
            yield from schema_parts(schema[key], [*path, key])
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                yield from schema_parts(sub, [*path, key, str(name)])
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                yield from schema_parts(sub, [*path, key, str(i)])
