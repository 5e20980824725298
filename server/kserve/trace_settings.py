"""Triton's trace and logging extensions, as far as Ferry can honour them.

Ferry does not trace requests (its request ids and Prometheus series do that job), so the trace
settings read as Triton's with tracing off, and an update may only keep it off: one that would
turn tracing on, or set anything else, is refused naming the setting. The log settings read
what the server's `log_level` says; Ferry sets them at start, so an update may only restate
them. Neither extension is listed in the server metadata: what they configure is not served.
"""

from __future__ import annotations

from typing import Any

from ferry.server.errors import InvalidInput, MalformedRequest

TRACE_OFF = "OFF"


def trace_settings() -> dict[str, Any]:
    """Triton's trace settings JSON (its values are strings), tracing off."""
    return {
        "trace_level": [TRACE_OFF],
        "trace_rate": "1000",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": "",
        "trace_mode": "triton",
    }


def update_trace_settings(update: Any) -> dict[str, Any]:
    """The settings after `update` (a JSON object): tracing off, or refused."""
    for key, value in _object(update).items():
        # Triton clears a setting with null: back to its default, which is off.
        if value is None:
            continue
        if key == "trace_level" and (value == [TRACE_OFF] or value == []):
            continue
        raise InvalidInput(
            key,
            "Ferry does not trace requests: the trace settings read with tracing OFF, and "
            'may only be set so (trace_level: ["OFF"])',
        )
    return trace_settings()


def log_settings(log_level: str) -> dict[str, Any]:
    """Triton's log settings JSON for Ferry's `log_level` (debug, info, warning, error)."""
    return {
        "log_file": "",
        "log_info": log_level in ("debug", "info"),
        "log_warning": log_level != "error",
        "log_error": True,
        "log_verbose_level": 1 if log_level == "debug" else 0,
        "log_format": "default",
    }


def update_log_settings(update: Any, log_level: str) -> dict[str, Any]:
    """The log settings, when `update` changes none of them; else refused naming the first."""
    current = log_settings(log_level)
    for key, value in _object(update).items():
        if key not in current or value != current[key]:
            raise InvalidInput(
                key,
                f"Ferry's logging is set at start (log_level = {log_level!r}): the log "
                "settings cannot be changed while it serves",
            )
    return current


def _object(update: Any) -> dict[str, Any]:
    if not isinstance(update, dict):
        raise MalformedRequest("the settings must be a JSON object")
    return update
