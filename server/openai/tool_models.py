"""OpenAI's shapes for structured outputs and tool calls: `response_format`, `tools`,
`tool_choice`, an assistant's `tool_calls` (in requests, responses and stream deltas)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints

from ferry.server.openai.request_base import OpenAIRequestModel

# -- requests -----------------------------------------------------------------------------------


class FunctionCallParam(OpenAIRequestModel):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCallParam(OpenAIRequestModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallParam


class JsonSchemaFormat(OpenAIRequestModel):
    # `schema` would shadow a BaseModel attribute: held as schema_, spelled schema on the wire.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(OpenAIRequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


FunctionName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class FunctionDefinition(OpenAIRequestModel):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ToolParam(OpenAIRequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(OpenAIRequestModel):
    name: str


class NamedToolChoice(OpenAIRequestModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


# -- responses ----------------------------------------------------------------------------------


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str = Field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """One piece of a streamed call: the first carries id, type and name; the rest arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall
