"""A KServe request's sequence parameters (`sequence_id`, `sequence_start`, `sequence_end`),
as tritonclient sends them on HTTP (JSON) and gRPC (InferParameter), checked before any work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ferry.server.errors import InvalidInput
from ferry.server.kserve.infer import ABSENT
from ferry.server.sequences import MAX_ID, MAX_ID_CHARS, SEQUENCE_ID, SequenceFlags


def sequence_flags(parameter: Callable[[str], Any]) -> SequenceFlags | None:
    """The request's place in a sequence (`parameter(name)`: its value, ABSENT when not sent);
    None when it names none: no id, or 0 or "" (Triton's "not in a sequence")."""
    sequence_id = parameter(SEQUENCE_ID)
    start, end = _flag(parameter, "sequence_start"), _flag(parameter, "sequence_end")
    if sequence_id is ABSENT or sequence_id == 0 or sequence_id == "":
        if start or end:
            raise InvalidInput(
                SEQUENCE_ID, "sequence_start and sequence_end need a non-zero or non-empty id"
            )
        return None
    if isinstance(sequence_id, bool) or not isinstance(sequence_id, int | str):
        raise InvalidInput(SEQUENCE_ID, "sequence_id must be an unsigned integer or a string")
    if isinstance(sequence_id, int) and not 0 < sequence_id <= MAX_ID:
        raise InvalidInput(SEQUENCE_ID, f"sequence_id must be within 1..{MAX_ID}")
    if isinstance(sequence_id, str) and len(sequence_id) > MAX_ID_CHARS:
        raise InvalidInput(
            SEQUENCE_ID, f"string correlation ID cannot be longer than {MAX_ID_CHARS} characters"
        )
    return SequenceFlags(sequence_id, start, end)


def _flag(parameter: Callable[[str], Any], name: str) -> bool:
    value = parameter(name)
    if value is ABSENT:
        return False
    if not isinstance(value, bool):
        raise InvalidInput(name, f"{name} must be a boolean")
    return value
