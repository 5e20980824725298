"""Grammar checks before work, and the one place guidance reaches onnxruntime-genai."""

from __future__ import annotations

import json

import pytest

from ferry.llm.base import Guidance
from ferry.llm.errors import InvalidSampling
from ferry.llm.guidance import apply_guidance, check_guidance


class Target:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def set_guidance(self, kind: str, data: str) -> None:
        self.calls.append((kind, data))


def test_apply_sets_kind_and_data_once_and_nothing_without_guidance():
    target = Target()
    apply_guidance(target, None)
    apply_guidance(target, Guidance("regex", "[a-z]+"))
    assert target.calls == [("regex", "[a-z]+")]


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"type": "object", "properties": {"a": {"not": {}}}}, "p.properties.a"),
        ({"type": "array", "items": {"type": "string", "format": "nope"}}, "p.items"),
        ({"anyOf": [{"type": "string"}, {"type": "nope"}]}, "p.anyOf.1"),
        ({"$ref": "#/$defs/missing"}, "p"),
    ],
)
def test_a_schema_that_cannot_compile_names_its_part(schema, path):
    with pytest.raises(InvalidSampling) as err:
        check_guidance(Guidance("json_schema", json.dumps(schema)), "p")
    assert err.value.field == path


@pytest.mark.parametrize(
    "guidance",
    [
        Guidance("json_schema", json.dumps({"type": "object", "properties": {"a": {}}})),
        Guidance("regex", "[0-9]{1,3}"),
        Guidance("lark_grammar", 'start: "a" | %json {"type": "integer"}'),
    ],
)
def test_what_compiles_passes(guidance):
    check_guidance(guidance, "p")


@pytest.mark.parametrize(
    "guidance", [Guidance("regex", "[a-z"), Guidance("lark_grammar", "start: missing")]
)
def test_bad_regex_and_lark_are_refused(guidance):
    with pytest.raises(InvalidSampling, match="cannot be used"):
        check_guidance(guidance, "p")
