"""One grammar checked as the engine will use it: bounds, llguidance's compile, and a matcher on
the model's own tokenizer that must allow a first token.

This runs in a checker process (`grammar_worker`), never on the event loop: llguidance's native
code may take seconds or crash on a hostile grammar, and either costs only that process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from ferry.llm.grammar_bounds import GrammarLimits, GrammarRefused, check_bounds

# Keys whose values are subschemas, or maps / lists of them.
_SCHEMA_KEYS = ("items", "additionalProperties", "not", "contains", "propertyNames")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


class GrammarChecker:
    """Checks grammars against the limits; keeps one llguidance tokenizer per tokenizer.json."""

    def __init__(self, limits: GrammarLimits) -> None:
        self.limits = limits
        self._tokenizers: dict[str, Any] = {}

    def check(self, kind: str, text: str, tokenizer: str | None = None) -> str:
        """The grammar as the engine takes it (`any_grammar`: GBNF converted to Lark, Lark as
        is); GrammarRefused when it is over a bound, cannot compile or admits no output."""
        started = time.monotonic()
        check_bounds(kind, text, self.limits)
        if kind in ("any_grammar", "choice"):
            text = _as_lark(text) if kind == "any_grammar" else _choice(text)
            check_bounds("lark_grammar", text, self.limits)
            kind = "lark_grammar"
        error = self._error(kind, text, tokenizer)
        if error is None:
            return text
        path: tuple[str, ...] = ()
        if kind == "json_schema":
            # Naming the part is best effort, within half the compile budget.
            deadline = started + self.limits.compile_timeout_s / 2
            path = failing_part(json.loads(text), _compiles_not, deadline)
        raise GrammarRefused(error, path=path)

    def _error(self, kind: str, text: str, tokenizer: str | None) -> str | None:
        from llguidance import LLMatcher

        error = compile_error(kind, text)
        if error is not None or tokenizer is None:
            return error
        matcher = LLMatcher(self._tokenizer(tokenizer), _grammar(kind, text), log_level=0)
        if not matcher.is_error():
            matcher.compute_logit_bias()  # the first token's mask, as the engine's first step
            if matcher.is_error():
                return f"the grammar admits no output ({_first_line(matcher.get_error())})"
        return _first_line(matcher.get_error()) if matcher.is_error() else None

    def _tokenizer(self, path: str) -> Any:
        if path not in self._tokenizers:
            from llguidance import LLTokenizer

            self._tokenizers[path] = LLTokenizer(path)
        return self._tokenizers[path]


def compile_error(kind: str, text: str) -> str | None:
    """llguidance's reason the grammar cannot be compiled, or None if it can."""
    from llguidance import LLMatcher

    try:
        grammar = _grammar(kind, text)
    except ValueError as exc:  # a grammar_from_* that refuses its input outright
        return _first_line(str(exc))
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    return _first_line(messages[0]) if is_error else None


def _compiles_not(schema: str) -> bool:
    return compile_error("json_schema", schema) is not None


def _grammar(kind: str, text: str) -> str:
    from llguidance import LLMatcher

    if kind == "json_schema":
        return LLMatcher.grammar_from_json_schema(text)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(text)
    return LLMatcher.grammar_from_lark(text)


def _as_lark(grammar: str) -> str:
    """Lark as is; GBNF/EBNF (what vLLM's xgrammar takes) converted to Lark by llguidance."""
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        return any_to_lark(grammar)
    except Exception as exc:  # the converter raises whatever its parser meets
        raise GrammarRefused(f"not a Lark or GBNF grammar: {exc}") from None


def _choice(choices: str) -> str:
    """A JSON list of strings as a Lark grammar: JSON's escaping is valid in Lark literals."""
    return "start: " + " | ".join(json.dumps(c) for c in json.loads(choices))


def _first_line(message: str) -> str:
    return message.strip().split("\n", 1)[0]


def failing_part(schema: Any, fails: Callable[[str], bool], deadline: float) -> tuple[str, ...]:
    """The path of the deepest subschema that fails on its own (with the root's definitions, so
    that its `$ref`s resolve), found by descending into the first failing child at each level:
    a few compiles per level, not one per part. () when only the whole fails."""
    if not isinstance(schema, dict):
        return ()
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    path: tuple[str, ...] = ()
    node = schema
    while True:
        for step, part in schema_children(node):
            if time.monotonic() >= deadline:
                return path
            if isinstance(part, dict) and fails(json.dumps({**defs, **part})):
                path, node = path + step, part
                break
        else:
            return path


def schema_children(schema: dict[str, Any]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Each direct subschema of `schema` with its path below it."""
    for key in _SCHEMA_KEYS:
        if isinstance(schema.get(key), dict):
            yield (key,), schema[key]
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                yield (key, str(name)), sub
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                yield (key, str(i)), sub
