"""The base of every OpenAI request model: unknown fields are accepted and logged, never an error
(clients sending newer OpenAI parameters are not rejected)."""

from __future__ import annotations

import logging

from pydantic import BaseModel, ConfigDict, model_validator

log = logging.getLogger("ferry.server.openai.protocol")


class OpenAIRequestModel(BaseModel):
    """Base for requests: unknown fields are accepted and logged, never an error."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _log_unknown_fields(self) -> OpenAIRequestModel:
        if self.model_extra:
            log.debug(
                "ignoring unknown fields in %s: %s", type(self).__name__, sorted(self.model_extra)
            )
        return self
