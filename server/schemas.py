"""Request and response bodies of /predict (OpenAPI at /docs is generated from these)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    model_validator,
)

TokenIds = list[StrictInt] | list[list[StrictInt]]
# A cross-encoder's input: two texts read together (a query and a document), with segment ids.
TextPair = Annotated[list[StrictStr], Field(min_length=2, max_length=2)]
# vLLM's `priority`: lower is served first; a 32-bit signed integer, as every engine and metric
# label takes it. Below 0 (more urgent than the default) is a privilege (server/tenancy.py).
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1
Priority = Annotated[StrictInt, Field(ge=PRIORITY_MIN, le=PRIORITY_MAX)]
PRIORITY_DESCRIPTION = "Queued requests with a lower number are served first (vLLM's meaning)."
MIN_TIMEOUT_MS = 1.0


class PredictRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"model": "all-MiniLM-L6-v2", "inputs": ["a sentence", "another one"]},
                {"input_ids": [[101, 7592, 102]], "attention_mask": [[1, 1, 1]]},
            ]
        },
    )

    model: StrictStr | None = Field(default=None, description="Model name; the default if absent.")
    inputs: StrictStr | list[StrictStr] | list[TextPair] | None = Field(
        default=None,
        description="Text, or a list of texts, tokenized by the server; or a list of "
        "[first, second] text pairs, each tokenized as one input with segment ids.",
    )
    input_ids: TokenIds | None = Field(
        default=None, description="Pre-tokenized input: one list of ids, or a list of them."
    )
    attention_mask: TokenIds | None = Field(
        default=None, description="Optional mask (0/1) shaped like input_ids."
    )
    token_type_ids: TokenIds | None = Field(
        default=None,
        description="Optional segment ids (0: first text, 1: second) shaped like input_ids, for "
        "models whose graph reads them (a pair's cross-encoder); zeros if absent.",
    )
    outputs: list[StrictStr] | None = Field(
        default=None, description="Model outputs to return; the model's configured ones if absent."
    )
    truncate: bool = Field(
        default=False, description="Cut texts longer than the model's limit instead of a 422."
    )
    timeout_ms: float | None = Field(
        default=None,
        # Under a millisecond no model answers over HTTP: refused (422), not queued to a 504.
        ge=MIN_TIMEOUT_MS,
        le=600_000,
        allow_inf_nan=False,  # NaN is "not a finite number", not "over 600000"
        description="Deadline for this request (504 after it), at least 1 ms.",
    )
    priority: Priority = Field(default=0, description=PRIORITY_DESCRIPTION)

    @model_validator(mode="after")
    def _one_kind_of_input(self) -> PredictRequest:
        if (self.inputs is None) == (self.input_ids is None):
            raise ValueError("send exactly one of 'inputs' (text) or 'input_ids' (tokens)")
        for name in ("attention_mask", "token_type_ids"):
            if getattr(self, name) is not None and self.input_ids is None:
                raise ValueError(f"'{name}' goes with 'input_ids'")
        return self

    def token_lists(
        self,
    ) -> tuple[list[list[int]], list[list[int]] | None, list[list[int]] | None]:
        """input_ids, attention_mask and token_type_ids as lists of items, whether one item or
        many was sent."""
        assert self.input_ids is not None
        batched = bool(self.input_ids) and isinstance(self.input_ids[0], list)
        ids = self.input_ids if batched else [self.input_ids]
        return ids, _items(self.attention_mask), _items(self.token_type_ids)  # type: ignore[return-value]  # `batched` told which list it is

    def texts(self) -> tuple[list[str], list[str] | None]:
        """The texts, and the second text of each pair when pairs were sent."""
        assert self.inputs is not None
        if isinstance(self.inputs, str):
            return [self.inputs], None
        if self.inputs and isinstance(self.inputs[0], list):
            pairs: list[list[str]] = self.inputs
            return [first for first, _ in pairs], [second for _, second in pairs]
        return list(self.inputs), None  # type: ignore[arg-type]  # pairs returned above: strings


def _items(values: TokenIds | None) -> list[Any] | None:
    if values is not None and values and not isinstance(values[0], list):
        return [values]
    return values


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class PredictResponse(BaseModel):
    model: str
    outputs: list[dict[str, Any]] = Field(description="One entry per input item, in order.")
    usage: Usage


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route can answer, all in the one error shape."""
    descriptions = {
        400: "Invalid request (OpenAI-compatible routes); `error.param` names the field",
        401: "Missing or wrong API key",
        403: "A priority below 0 that this API key (or none) may not ask for; `error.param`",
        404: "Unknown model",
        413: "Body larger than the configured limit",
        415: "Content-Type is not application/json",
        422: "Invalid input; `error.param` names the field",
        429: "Queue full; see Retry-After",
        500: "Inference failed for this request",
        503: "Not ready, draining, or backend unavailable; see Retry-After",
        504: "Deadline passed",
    }
    return {s: {"model": ErrorResponse, "description": descriptions[s]} for s in statuses}
