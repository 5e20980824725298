"""The log's two formats, and the request id each record is stamped with (server/logs.py)."""

from __future__ import annotations

import json
import logging

import pytest

from ferry.server import request_ids
from ferry.server.logs import make_handler

pytestmark = pytest.mark.unit


def _record(
    message: str = "model %s failed", exc: BaseException | None = None
) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("ferry.test", logging.WARNING, __file__, 1, message, ("m",), exc_info)


def _format(log_format: str, record: logging.LogRecord, request_id: str | None) -> str:
    handler = make_handler(log_format)  # type: ignore[arg-type]  # the two literals
    token = request_ids.current.set(request_id)
    try:
        assert handler.filter(record)
    finally:
        request_ids.current.reset(token)
    return handler.format(record)


def test_text_names_the_request_only_within_one():
    assert _format("text", _record(), "abc").endswith(" WARNING ferry.test: [abc] model m failed")
    assert _format("text", _record(), None).endswith(" WARNING ferry.test: model m failed")


def test_json_is_one_object_a_line_with_the_id_and_the_traceback():
    try:
        raise ValueError("bad\nrow")
    except ValueError as exc:
        record = _record(exc=exc)
    line = _format("json", record, "abc")
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["level"] == "WARNING"
    assert parsed["logger"] == "ferry.test"
    assert parsed["message"] == "model m failed"
    assert parsed["request_id"] == "abc"
    assert parsed["time"].endswith("+00:00")
    assert "ValueError: bad\nrow" in parsed["exc_info"]
    assert "request_id" not in json.loads(_format("json", _record(), None))
