"""The work a grammar may ask for, measured before llguidance sees it.

llguidance's native code recurses over a grammar's rules (a chain of ~900 `$ref`s or ~3000 Lark
rules overflows its stack: SIGSEGV), and onnxruntime-genai stops a generation whose grammar
outgrows llguidance's ParserLimits mid-way (2000 Earley items in a row: `anyOf` of 1000+ objects;
lexer states: `a{1000000}`). These bounds keep every grammar Ferry accepts well inside both.
Each refusal names the setting that bounds it, so an operator knows what to raise.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# A quantifier `{n}`, `{n,}` or `{n,m}` (regex and GBNF), or Lark's `~ n` / `~ n..m`.
_BRACES = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_LARK_TILDE = re.compile(r"~\s*(\d+)(?:\s*\.\.\s*(\d+))?")
# A Lark rule or terminal definition (`name:`, `?name:`, `NAME.2:`) or a GBNF one (`name ::=`).
_LARK_RULE = re.compile(r"^\s*[?!]?[A-Za-z_][\w]*(?:\.-?\d+)?\s*:(?!:)", re.MULTILINE)
_GBNF_RULE = re.compile(r"^\s*[A-Za-z_][\w-]*\s*::=", re.MULTILINE)
_LARK_REGEX = re.compile(r"/((?:[^/\\\n]|\\.)+)/[imslux]*")
_QUOTED = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "enum", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_ALTERNATIVES = "grammar_max_alternatives"


@dataclass(frozen=True)
class GrammarLimits:
    """Settings' grammar_* bounds (server/settings.py), passed to the checker processes."""

    max_chars: int = 131_072
    max_rules: int = 1000
    max_depth: int = 64
    max_repeat: int = 10_000
    max_alternatives: int = 1000
    compile_timeout_s: float = 10.0


class GrammarRefused(Exception):
    """A grammar over a bound (`bound` names the setting) or one llguidance cannot use; `path`
    is the failing part of a JSON schema, when it is known."""

    def __init__(self, message: str, bound: str | None = None, path: tuple[str, ...] = ()):
        super().__init__(message)
        self.bound = bound
        self.path = path


def check_bounds(kind: str, text: str, limits: GrammarLimits) -> None:
    """GrammarRefused naming the first bound `text` goes over; kinds as the checker's
    (json_schema, regex, lark_grammar, any_grammar: Lark or GBNF, choice: a JSON list)."""
    _at_most(len(text), limits.max_chars, "grammar_max_chars", "characters")
    if kind == "json_schema":
        _schema_bounds(text, limits)
    elif kind == "regex":
        _regex_bounds(text, limits)
    elif kind == "choice":
        choices = text.count('", "') + 1  # json.dumps' separator: one more choice each
        _at_most(choices, limits.max_alternatives, _ALTERNATIVES, "choices")
    else:
        _grammar_bounds(text, limits)


def _at_most(value: int, limit: int, bound: str, what: str) -> None:
    if value > limit:
        raise GrammarRefused(f"the grammar has {value} {what}; at most {limit} ({bound})", bound)


def _schema_bounds(text: str, limits: GrammarLimits) -> None:
    try:
        schema = json.loads(text)
    except RecursionError:
        raise GrammarRefused(
            f"the schema nests deeper than {limits.max_depth} levels (grammar_max_depth)",
            "grammar_max_depth",
        ) from None
    subschemas, depth = 0, 0
    for level, node in _containers(schema):
        depth = max(depth, level)
        if isinstance(node, dict):
            # A map of named subschemas (`properties`, `$defs`) is not a subschema itself.
            subschemas += 1 - sum(isinstance(node.get(key), dict) for key in _SCHEMA_MAPS)
            for key in _SCHEMA_LISTS:
                if isinstance(node.get(key), list):
                    what = f"entries in one {key}"
                    _at_most(len(node[key]), limits.max_alternatives, _ALTERNATIVES, what)
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                _regex_bounds(pattern, limits)
    _at_most(depth, limits.max_depth, "grammar_max_depth", "levels of nesting")
    _at_most(subschemas, limits.max_rules, "grammar_max_rules", "subschemas")


def _containers(value: Any) -> Iterator[tuple[int, Any]]:
    """Every dict and list in a JSON value with its depth, without recursing (a schema parsed
    from text may be as deep as Python's recursion limit allows)."""
    stack = [(1, value)]
    while stack:
        level, node = stack.pop()
        if isinstance(node, dict | list):
            yield level, node
            children = node.values() if isinstance(node, dict) else node
            stack.extend((level + 1, child) for child in children)


def _regex_bounds(regex: str, limits: GrammarLimits) -> None:
    weight, depth = regex_weight(regex)
    _at_most(depth, limits.max_depth, "grammar_max_depth", "levels of nested groups")
    what = "repetitions (nested counts multiply)"
    _at_most(weight, limits.max_repeat, "grammar_max_repeat", what)


def regex_weight(regex: str) -> tuple[int, int]:
    """(the largest repetition count of any atom, nested `{n}` counts multiplied; the deepest
    group nesting). `(a{1000}){1000}` weighs 1,000,000 and `a{1000000}` as much."""
    stack = [1]  # the heaviest atom so far in each open group
    last, depth, i = 1, 1, 0
    while i < len(regex):
        char = regex[i]
        if char == "\\":
            last, i = 1, i + 2
        elif char == "[":
            last, i = 1, _class_end(regex, i)
        elif char == "(":
            stack.append(1)
            depth, i = max(depth, len(stack)), i + 1
        elif char == ")" and len(stack) > 1:
            last = stack.pop()
            i += 1
        elif char == "{" and (quantifier := _BRACES.match(regex, i)):
            low, high = quantifier.group(1), quantifier.group(2)
            last *= max(int(low), int(high) if high else 0, 1)
            i = quantifier.end()
        else:
            last, i = 1, i + 1
        stack[-1] = max(stack[-1], last)
    return max(stack), depth - 1


def _class_end(regex: str, start: int) -> int:
    """The index after the character class opening at `start` (`[]a]` and `[^]a]` included)."""
    i = start + 1
    if i < len(regex) and regex[i] == "^":
        i += 1
    if i < len(regex) and regex[i] == "]":
        i += 1
    while i < len(regex) and regex[i] != "]":
        i += 2 if regex[i] == "\\" else 1
    return i + 1


def _grammar_bounds(text: str, limits: GrammarLimits) -> None:
    """Lark or GBNF: rules, alternatives of one rule, nesting, and every repetition count."""
    bare = _QUOTED.sub('""', text)  # literals hold no syntax
    for regex in _LARK_REGEX.findall(bare):
        _regex_bounds(regex, limits)
    bare = _LARK_REGEX.sub("//", bare)
    rules = _GBNF_RULE if "::=" in bare else _LARK_RULE
    starts = [m.start() for m in rules.finditer(bare)]
    _at_most(len(starts), limits.max_rules, "grammar_max_rules", "rules")
    starts.append(len(bare))
    for begin, end in itertools.pairwise(starts):
        alternatives = bare.count("|", begin, end) + 1
        _at_most(alternatives, limits.max_alternatives, _ALTERNATIVES, "alternatives in one rule")
    counts = [*_BRACES.findall(bare), *_LARK_TILDE.findall(bare)]
    for low, high in counts:
        count = max(int(low), int(high) if high else 0)
        _at_most(count, limits.max_repeat, "grammar_max_repeat", "repetitions")
    depth = level = 0
    for char in bare:
        if char in "([":
            level += 1
            depth = max(depth, level)
        elif char in ")]":
            level -= 1
    _at_most(depth, limits.max_depth, "grammar_max_depth", "levels of nested groups")
