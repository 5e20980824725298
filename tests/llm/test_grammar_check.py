"""Grammar checks as the checker processes run them (llm/grammar_check.py, grammar_bounds.py):
each bound refused by name before llguidance sees the grammar, compile errors naming a schema's
part, and grammars that admit no output refused on the model's own tokenizer."""

from __future__ import annotations

import json

import pytest

from ferry.llm.grammar_bounds import GrammarLimits, GrammarRefused, regex_weight
from ferry.llm.grammar_check import GrammarChecker
from tests.llm.grammars import chained_defs, gbnf_chain, lark_chain

pytestmark = pytest.mark.unit

TOKENIZER = "models/tiny-llm/onnx/tokenizer.json"
CHECKER = GrammarChecker(GrammarLimits())


def refusal(kind: str, text: str, tokenizer: str | None = TOKENIZER) -> GrammarRefused:
    with pytest.raises(GrammarRefused) as err:
        CHECKER.check(kind, text, tokenizer)
    return err.value


@pytest.mark.parametrize(
    ("kind", "text", "bound"),
    [
        ("json_schema", chained_defs(1000), "grammar_max_rules"),  # SIGSEGV in llguidance
        ("lark_grammar", lark_chain(4000), "grammar_max_rules"),  # SIGSEGV too
        ("any_grammar", gbnf_chain(2000), "grammar_max_rules"),  # seconds in the converter
        ("regex", "(a{1000}){1000}", "grammar_max_repeat"),  # the engine's lexer gives up
        ("regex", "a{1000000}", "grammar_max_repeat"),
        ("lark_grammar", 'start: /a{20000}/ | "b"', "grammar_max_repeat"),
        (
            "json_schema",
            json.dumps({"type": "string", "pattern": "^(a{1000}){1000}$"}),
            "grammar_max_repeat",
        ),
        (
            "json_schema",
            json.dumps({"anyOf": [{"const": i} for i in range(5000)]}),
            "grammar_max_alternatives",
        ),
        ("choice", json.dumps([f"c{i}" for i in range(1001)]), "grammar_max_alternatives"),
        ("regex", "(" * 100 + "a" + ")" * 100, "grammar_max_depth"),
        ("json_schema", "[" * 100 + "]" * 100, "grammar_max_depth"),
        ("regex", "a" * 200_000, "grammar_max_chars"),
    ],
)
def test_each_bound_is_refused_by_name_before_llguidance(kind, text, bound):
    error = refusal(kind, text)
    assert error.bound == bound and bound in str(error)


@pytest.mark.parametrize(
    ("kind", "text"),
    [("regex", r"[^\s\S]"), ("lark_grammar", "start: start"), ("json_schema", '{"$ref": "#"}')],
)
def test_a_grammar_that_admits_no_output_is_refused(kind, text):
    assert "admits no output" in str(refusal(kind, text))


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"type": "object", "properties": {"a": {"not": {}}}}, ("properties", "a")),
        ({"type": "array", "items": {"type": "string", "format": "nope"}}, ("items",)),
        ({"anyOf": [{"type": "string"}, {"type": "nope"}]}, ("anyOf", "1")),
        ({"$ref": "#/$defs/missing"}, ()),
        # Large unused definitions beside the broken part: still named.
        (
            {
                "$defs": {f"d{i}": {"type": "string", "maxLength": i + 1} for i in range(300)},
                "type": "object",
                "properties": {"ok": {"type": "integer"}, "bad": {"type": "nope"}},
            },
            ("properties", "bad"),
        ),
    ],
)
def test_a_schema_that_cannot_compile_names_its_part(schema, path):
    assert refusal("json_schema", json.dumps(schema), None).path == path


@pytest.mark.parametrize(
    ("kind", "text", "engine_gets"),
    [
        ("json_schema", json.dumps({"type": "object", "properties": {"a": {}}}), None),
        ("regex", "[0-9]{1,3}", None),
        ("lark_grammar", 'start: "a" | %json {"type": "integer"}', None),
        ("any_grammar", 'root ::= "yes" | "no"', 'start: "yes"\n     | "no"'),
        ("choice", json.dumps(["yes", 'say "no"']), 'start: "yes" | "say \\"no\\""'),
        ("json_schema", chained_defs(300), None),  # chains well inside the bounds compile
    ],
)
def test_what_compiles_passes_as_the_engine_takes_it(kind, text, engine_gets):
    grammar = CHECKER.check(kind, text, TOKENIZER)
    if engine_gets is None:
        assert grammar == text
    else:
        assert engine_gets in grammar


@pytest.mark.parametrize(("kind", "text"), [("regex", "[a-z"), ("lark_grammar", "start: missing")])
def test_bad_regex_and_lark_are_refused(kind, text):
    assert refusal(kind, text).bound is None


@pytest.mark.parametrize(
    ("regex", "weight", "depth"),
    [
        ("(a{1000}){1000}", 1_000_000, 1),
        ("a{2,5}b{7}", 7, 0),
        (r"[{(]{3}\((x{3}|y{4,}){2}", 8, 1),  # classes and escapes are atoms; `{4,}` counts 4
        ("((a))", 1, 2),
    ],
)
def test_regex_weight_multiplies_nested_counts(regex, weight, depth):
    assert regex_weight(regex) == (weight, depth)
