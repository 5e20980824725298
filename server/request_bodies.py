"""A hot route's JSON body parsed into its pydantic request model, a large one off the event
loop (large_bodies.py): its refusal too, since naming the field a broken body fails in scans
the body (4 MB of newlines: where line 4,194,305 starts)."""

from __future__ import annotations

from functools import partial
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from ferry.server.errors import Refused, validation_failure
from ferry.server.large_bodies import decoded

M = TypeVar("M", bound=BaseModel)


async def parse_body(model: type[M], body: bytes) -> M:
    """`model.model_validate_json(body)`; pydantic's complaint comes out as `Refused`, its
    Failure decided where the parsing ran."""
    return await decoded(len(body), partial(_parse, model, body))


def _parse(model: type[M], body: bytes) -> M:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise Refused(validation_failure(exc.errors())) from None
