"""OpenAI's `strict: true` (on a `json_schema` response format or a tool): the schema must be
closed, or the request is refused, as OpenAI refuses it.

Closed means every object sets `additionalProperties: false` and lists all of its `properties`
in `required`. A schema without `strict` is compiled as written: an object that does not close
itself lets the model add keys, which a small model may do until `max_tokens`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ferry.llm.errors import InvalidSampling
from ferry.llm.grammar_check import schema_children


def check_strict(schema: Any, param: str) -> None:
    """InvalidSampling naming the first object of `schema` (at `param`) that is not closed."""
    for path, part in _parts(schema, ()):
        if not isinstance(part, dict) or not _is_object(part):
            continue
        where = ".".join([param, *path])
        if part.get("additionalProperties") is not False:
            raise InvalidSampling(
                where, f"{where}: strict mode needs additionalProperties: false on every object"
            )
        required = part.get("required") or []
        missing = [name for name in part.get("properties") or {} if name not in required]
        if missing:
            raise InvalidSampling(
                where, f"{where}: strict mode needs every property in required; missing {missing}"
            )


def _is_object(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return (
        kind == "object"
        or (isinstance(kind, list) and "object" in kind)
        or ("properties" in schema)
    )


def _parts(schema: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every subschema with its path, depth first (the body parser bounds the depth)."""
    yield path, schema
    if isinstance(schema, dict):
        for step, child in schema_children(schema):
            yield from _parts(child, path + step)
