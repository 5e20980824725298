"""The Responses API's request (`POST /v1/responses`), as the chat request it runs as.

Ferry keeps no responses: `store: true` and `previous_response_id` are refused with a 400 naming
them (the client sends the whole conversation, as `store: false` clients do). Input items map to
chat messages: messages (text parts), `function_call` items to an assistant's tool calls and
`function_call_output` items to `tool` messages; `instructions` becomes the system message.
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Any, Literal, cast

from pydantic import (
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StringConstraints,
    Tag,
    ValidationError,
)

from ferry.llm.errors import InvalidSampling
from ferry.server.openai.json_depth import check_json_depth
from ferry.server.openai.protocol import CacheSalt, ChatCompletionRequest
from ferry.server.openai.request_base import OpenAIRequestModel, RequestBody
from ferry.server.openai.tool_models import FunctionDefinition, NamedFunction

# Fields Ferry cannot honour, with the values that ask for nothing.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "previous_response_id": (None,),
    "conversation": (None,),
    "store": (None, False),
    "background": (None, False),
    "prompt": (None,),
    "include": (None, []),
    "reasoning": (None,),
    "max_tool_calls": (None,),
    "top_logprobs": (None, 0),
    # Ferry never drops input to fit (a prompt too long is a 400) and has one service tier.
    "truncation": (None, "disabled"),
    "service_tier": (None, "auto", "default"),
}
_WHY = {
    "previous_response_id": "this server keeps no responses: send the whole conversation",
    "store": "this server keeps no responses: send store=false",
    "conversation": "this server keeps no conversations: send the whole conversation",
    "truncation": "this server never truncates input: send truncation=disabled",
    "service_tier": "this server has one service tier: send auto or default",
}
VERBOSITY_DEFAULT = "medium"  # text.verbosity: the model's own; no other can be honoured
# OpenAI's metadata bounds: 16 pairs, keys of at most 64 characters, values of at most 512.
MetadataKey = Annotated[str, StringConstraints(max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]
Metadata = Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)]


# Chat's parameter names -> the Responses API's, for errors raised on the chat path.
_RENAMES = (
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    ("messages", "input"),
)


def responses_error(error: InvalidSampling) -> InvalidSampling:
    """`error` naming the Responses request's field instead of the chat request's."""
    field = error.field
    for chat, responses in _RENAMES:
        if field.startswith(chat):
            field = responses + field[len(chat) :]
            break
    if field.startswith("tools"):
        field = field.replace(".function.", ".", 1)  # Responses tools are flat
    if field == error.field:
        return error
    return InvalidSampling(field, str(error).replace(error.field, field))


# What an SDK sends back of an earlier response's output (its ids, status, annotations): facts
# about that turn, not parameters of this one, so they are read and not needed.
ItemStatus = Literal["in_progress", "completed", "incomplete"] | None


class InputText(OpenAIRequestModel):
    type: Literal["input_text", "output_text", "text"]
    text: str
    annotations: list[Any] | None = None  # an output_text's, from an earlier response
    logprobs: list[Any] | None = None


class MessageItem(OpenAIRequestModel):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]
    id: str | None = None
    status: ItemStatus = None

    @cached_property
    def text(self) -> str:
        """The content as one string (parts joined once, whoever asks)."""
        return _text(self.content)


class FunctionCallItem(OpenAIRequestModel):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ItemStatus = None


class FunctionCallOutputItem(OpenAIRequestModel):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: ItemStatus = None


def _item_type(item: Any) -> str | None:
    """An input item's `type` (a message may leave it out), so that only the model of that
    type validates it and an error names what is wrong with it, not with every other type."""
    if isinstance(item, dict):
        return cast(str | None, item.get("type", "message"))
    return cast(str | None, getattr(item, "type", None))


ITEM_TYPES = ("message", "function_call", "function_call_output")
InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(
        _item_type,
        custom_error_type="input_item_type",
        custom_error_message=f"an input item's type must be one of {', '.join(ITEM_TYPES)}",
    ),
]
# A text, or a list of items: decided by the JSON type, so that an error in an item is not
# reported as "input should be a valid string".
Input = Annotated[
    Annotated[Annotated[str, Field(min_length=1)], Tag("text")]
    | Annotated[Annotated[list[InputItem], Field(min_length=1)], Tag("items")],
    Discriminator(
        lambda v: "text" if isinstance(v, str) else "items" if isinstance(v, list) else None,
        custom_error_type="input_type",
        custom_error_message="input must be a string or a list of input items",
    ),
]


class FunctionTool(FunctionDefinition):
    """Responses' flat tool: chat's function definition with its `type` beside it."""

    type: Literal["function"]


class NamedFunctionChoice(NamedFunction):
    type: Literal["function"]


class TextFormat(OpenAIRequestModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(OpenAIRequestModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(RequestBody):
    UNSUPPORTED = UNSUPPORTED
    WHY = _WHY

    model: str
    input: Input
    instructions: str | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat = Field(default=1.0, ge=0.0, le=2.0)
    top_p: StrictFloat = Field(default=1.0, gt=0.0, le=1.0)
    stream: StrictBool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    text: TextConfig | None = None
    metadata: Metadata | None = None
    user: str | None = None
    cache_salt: CacheSalt | None = None  # vLLM's extension (server/tenancy.py)

    def check_supported(self) -> None:
        for i, item in enumerate(self.input if isinstance(self.input, list) else ()):
            if isinstance(item, FunctionCallItem):
                check_json_depth(item.arguments, f"input[{i}].arguments")
        verbosity = self.text.verbosity if self.text else None
        if verbosity not in (None, VERBOSITY_DEFAULT):
            message = f"text.verbosity: only {VERBOSITY_DEFAULT} (the model's own) is supported"
            raise InvalidSampling("text.verbosity", message)

    def texts(self) -> list[str]:
        """The input's texts, one per item (so `input[i]` names item i), for the size bounds
        checked before tokenizing; `instructions` is bounded on its own, under its name."""
        if isinstance(self.input, str):
            return [self.input]
        texts = []
        for item in self.input:
            if isinstance(item, MessageItem):
                texts.append(item.text)
            elif isinstance(item, FunctionCallItem):
                texts.append(item.arguments)
            else:
                texts.append(_text(item.output))
        return texts

    def to_chat(self) -> ChatCompletionRequest:
        """The chat request this runs as: same planning, same engine path."""
        self.check_supported()
        body: dict[str, Any] = {
            "model": self.model,
            "messages": self._messages(),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stream": self.stream,
            "cache_salt": self.cache_salt,
        }
        if self.max_output_tokens is not None:
            body["max_completion_tokens"] = self.max_output_tokens
        if self.tools:
            body["tools"] = [
                {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                for t in self.tools
            ]
        if isinstance(self.tool_choice, NamedFunctionChoice):
            body["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        elif self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        if self.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = self.parallel_tool_calls
        fmt = self.text.format if self.text else None
        if fmt is not None and fmt.type == "json_schema":
            schema = {"name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif fmt is not None:
            body["response_format"] = {"type": fmt.type}
        try:
            return ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:  # a tool or format that chat's schema refuses
            error = exc.errors()[0]
            param = ".".join(str(part) for part in error["loc"])
            raise responses_error(InvalidSampling(param, error["msg"])) from None

    def _messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            return [*messages, {"role": "user", "content": self.input}]
        for item in self.input:
            if isinstance(item, MessageItem):
                messages.append({"role": item.role, "content": item.text})
            elif isinstance(item, FunctionCallItem):
                call = {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments},
                }
                last = messages[-1] if messages else None
                if last and last["role"] == "assistant" and "tool_calls" in last:
                    last["tool_calls"].append(call)  # parallel calls: one assistant turn
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            else:
                messages.append(
                    {"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)}
                )
        return messages


def _text(output: str | list[InputText]) -> str:
    return output if isinstance(output, str) else "\n".join(p.text for p in output)
