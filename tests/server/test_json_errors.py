"""Naming the field a malformed JSON body breaks in (server/json_errors.py), without a server."""

from __future__ import annotations

import pytest

from ferry.server.json_errors import _SCAN_LIMIT, _line_start, field_at, json_error

pytestmark = pytest.mark.unit


def test_the_fault_position_is_found_across_lines_and_named_by_key_and_index():
    body = b'{"model": "m",\n "inputs": ["ok", "\\ud800"]}'
    param, message = json_error(body, "unexpected end of hex escape at line 2 column 24")
    assert param == "inputs[1]" and "lone surrogate" in message


def test_nesting_is_named_where_it_first_passes_the_bound():
    assert field_at(b'{"a": [1], "b": {"c": ' + b"[" * 300) == "b"
    assert field_at(b"[" * 300) is None  # no field to name: the body itself
    assert field_at(b'{"a": [[1]]}') is None  # not deep at all


def test_a_fault_past_the_scan_window_names_the_key_without_an_index():
    body = b'{"inputs": [' + b'"x", ' * (_SCAN_LIMIT // 5) + b'"\\udfff"]}'
    assert field_at(body, len(body) - 4) == "inputs"


def test_commas_and_brackets_inside_strings_are_not_structure():
    body = b'{"a": "x,]}{[", "inputs": ["[,", "\\ud800"]}'
    assert field_at(body, body.index(b"\\ud800")) == "inputs[1]"


@pytest.mark.parametrize("body", [b"\n" * 20_000, b"ab\ncd\n\n" * 3000 + b"x", b"abc", b""])
def test_a_line_is_found_by_counting_blocks_as_by_walking_newlines(body):
    for line in (1, 2, 3, 4097, 9000, body.count(b"\n") + 1, body.count(b"\n") + 2):
        start, walked = 0, True
        for _ in range(line - 1):
            start = body.find(b"\n", start) + 1
            if start == 0:
                walked = False
                break
        assert _line_start(body, line) == (start if walked else None), line
