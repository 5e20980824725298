"""The Anthropic Messages API's request, as the chat request it runs as (shaped after vLLM's
`entrypoints/anthropic/protocol.py`, but Ferry's own).

Blocks map to chat messages: text blocks to content, an assistant's `tool_use` blocks to its tool
calls, a user's `tool_result` blocks to `tool` messages (before the user's text, in order),
`system` to the system message. `tool_choice` `any` is OpenAI's `required`, `tool` a named
function. Stop sequences run with `include_stop_str_in_output`, so the answer can say which one
matched (`stop_sequence`) and cut it itself (messages.py). What Ferry cannot honour (images,
documents, extended thinking, MCP servers) is a 400 naming it; an unknown field too.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
)

from ferry.llm.errors import InvalidSampling
from ferry.server.openai.protocol import MAX_STOP, MAX_STOP_CHARS, ChatCompletionRequest
from ferry.server.openai.request_base import OpenAIRequestModel, RequestBody
from ferry.server.openai.tool_models import FunctionName

# Anthropic's parameters Ferry cannot honour, with the values that ask for nothing.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "thinking": (None, {"type": "disabled"}),
    "mcp_servers": (None, []),
    "container": (None,),
    "context_management": (None,),
    "service_tier": (None, "auto", "standard_only"),
    "diagnostics": (None,),
    "inference_geo": (None,),
    "speed": (None,),
    "user_profile_id": (None,),
    "workspace_id": (None,),
}
_WHY = {
    "thinking": "extended thinking is not supported by this server: send type disabled",
    "service_tier": "this server has one service tier: send auto or standard_only",
}
StopSequence = Annotated[StrictStr, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class CacheControl(OpenAIRequestModel):
    """A prompt-caching breakpoint: Ferry reuses every shared prefix anyway (its prefix cache),
    so the hint asks for nothing more."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(OpenAIRequestModel):
    type: Literal["text"]
    text: StrictStr
    cache_control: CacheControl | None = None
    citations: None = None  # Ferry never writes them; a client may send back null


class DirectCaller(OpenAIRequestModel):
    type: Literal["direct"]  # the model called it (what Ferry's calls are); not a code tool's


class ToolUseBlock(OpenAIRequestModel):
    type: Literal["tool_use"]
    id: StrictStr
    name: StrictStr
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    caller: DirectCaller | None = None  # as the SDK sends a reply back
    toolset_name: None = None


class ToolResultBlock(OpenAIRequestModel):
    type: Literal["tool_result"]
    tool_use_id: StrictStr
    content: StrictStr | list[TextBlock] = ""
    is_error: StrictBool = False
    cache_control: CacheControl | None = None
    toolset_name: None = None

    @property
    def text(self) -> str:
        text = self.content if isinstance(self.content, str) else _joined(self.content)
        return f"Error: {text}" if self.is_error else text  # the model reads the failure


# Tags named as pydantic names a union's members, so that an error's path leaves them out.
_BLOCK_TAGS = {"text": "TextBlock", "tool_use": "ToolUseBlock", "tool_result": "ToolResultBlock"}


def _block_type(block: Any) -> str | None:
    kind = block.get("type") if isinstance(block, dict) else getattr(block, "type", None)
    return _BLOCK_TAGS.get(kind) if isinstance(kind, str) else None


BLOCK_TYPES = "text, tool_use, tool_result"
ContentBlock = Annotated[
    Annotated[TextBlock, Tag("TextBlock")]
    | Annotated[ToolUseBlock, Tag("ToolUseBlock")]
    | Annotated[ToolResultBlock, Tag("ToolResultBlock")],
    Discriminator(
        _block_type,
        custom_error_type="content_block_type",
        custom_error_message=f"a content block's type must be one of {BLOCK_TYPES} here "
        "(images, documents and thinking are not supported by this server)",
    ),
]


def _by_json_type(tag: str) -> Discriminator:
    """A text, or a list of blocks: decided by the JSON type, so that an error in a block is not
    reported as "should be a valid string"."""
    return Discriminator(
        lambda v: "str" if isinstance(v, str) else "list[Block]" if isinstance(v, list) else None,
        custom_error_type=f"{tag}_type",
        custom_error_message=f"{tag} must be a string or a list of content blocks",
    )


Content = Annotated[
    Annotated[StrictStr, Tag("str")] | Annotated[list[ContentBlock], Tag("list[Block]")],
    _by_json_type("content"),
]
System = Annotated[
    Annotated[StrictStr, Tag("str")] | Annotated[list[TextBlock], Tag("list[Block]")],
    _by_json_type("system"),
]


class Message(OpenAIRequestModel):
    role: Literal["user", "assistant"]
    content: Content


class Tool(OpenAIRequestModel):
    type: Literal["custom"] | None = None  # a client tool; Anthropic's server tools are refused
    name: FunctionName
    description: StrictStr | None = None
    input_schema: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolChoice(OpenAIRequestModel):
    type: Literal["auto", "any", "tool", "none"]
    name: FunctionName | None = None
    disable_parallel_tool_use: StrictBool | None = None


class JsonOutputFormat(OpenAIRequestModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(OpenAIRequestModel):
    format: JsonOutputFormat | None = None  # structured output: chat's json_schema format
    effort: None = None  # a thinking budget: Ferry's models do not think


class Metadata(OpenAIRequestModel):
    user_id: Annotated[StrictStr, Field(max_length=256)] | None = None


class _Prompt(RequestBody):
    """What a prompt is made of: shared by a message and a count of its tokens."""

    UNSUPPORTED = UNSUPPORTED
    WHY = _WHY

    model: StrictStr
    messages: Annotated[list[Message], Field(min_length=1)]
    system: System | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None

    def texts(self) -> list[str]:
        """Each message's text (tool inputs and results included), so `messages[i]` names the
        one past the size bounds checked before tokenizing."""
        return [_message_text(m) for m in self.messages]

    def to_chat(self, **sampling: Any) -> ChatCompletionRequest:
        """The chat request this runs as: same planning, grammars and engine."""
        body: dict[str, Any] = {"model": self.model, "messages": self._messages(), **sampling}
        if self.tools:
            body["tools"] = [_tool(t) for t in self.tools]
        choice = self.tool_choice
        if choice is not None:
            if choice.type == "tool":
                if choice.name is None:
                    raise InvalidSampling("tool_choice.name", "tool_choice.name: required")
                named = {"type": "function", "function": {"name": choice.name}}
                body["tool_choice"] = named
            else:
                body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[
                    choice.type
                ]
            if choice.disable_parallel_tool_use:
                body["parallel_tool_calls"] = False
        try:
            return ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:  # a tool that chat's schema refuses
            error = exc.errors()[0]
            param = ".".join(str(part) for part in error["loc"])
            raise InvalidSampling(param, f"{param}: {error['msg']}") from None

    def _messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.system:
            system = self.system if isinstance(self.system, str) else _joined(self.system)
            messages.append({"role": "system", "content": system})
        for message in self.messages:
            messages += _chat_messages(message)
        return messages


class MessagesRequest(_Prompt):
    max_tokens: StrictInt = Field(ge=1)
    stop_sequences: Annotated[list[StopSequence], Field(max_length=MAX_STOP)] | None = None
    stream: StrictBool = False
    temperature: StrictFloat = Field(default=1.0, ge=0.0, le=1.0, allow_inf_nan=False)
    top_p: StrictFloat | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: StrictInt | None = Field(default=None, ge=0)
    metadata: Metadata | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControl | None = None  # Ferry's prefix cache reuses every prefix

    def chat(self) -> ChatCompletionRequest:
        sampling: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stream": self.stream,
        }
        if self.top_p is not None:
            sampling["top_p"] = self.top_p
        if self.top_k:
            sampling["top_k"] = self.top_k
        if self.stop_sequences:
            sampling["stop"] = self.stop_sequences
            sampling["include_stop_str_in_output"] = True  # to say which one (messages.py)
        output = self.output_config.format if self.output_config else None
        if output is not None:
            schema = {"name": "output", "schema": output.schema_}
            sampling["response_format"] = {"type": "json_schema", "json_schema": schema}
        if self.metadata is not None and self.metadata.user_id is not None:
            sampling["user"] = self.metadata.user_id
        return self.to_chat(**sampling)


class CountTokensRequest(_Prompt):
    pass


def _joined(blocks: list[TextBlock]) -> str:
    return "\n".join(block.text for block in blocks)


def _tool(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _message_text(message: Message) -> str:
    if isinstance(message.content, str):
        return message.content
    parts = []
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            parts.append(json.dumps(block.input))
        else:
            parts.append(block.text)
    return "\n".join(parts)


def _chat_messages(message: Message) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: a user's tool results first, as `tool`
    messages, then its text; an assistant's text with its tool calls."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    texts = [b.text for b in message.content if isinstance(b, TextBlock)]
    calls = [b for b in message.content if isinstance(b, ToolUseBlock)]
    results = [b for b in message.content if isinstance(b, ToolResultBlock)]
    if message.role == "user" and calls:
        raise InvalidSampling("messages", "tool_use blocks belong to assistant messages")
    if message.role == "assistant" and results:
        raise InvalidSampling("messages", "tool_result blocks belong to user messages")
    chat: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": r.tool_use_id, "content": r.text} for r in results
    ]
    if message.role == "assistant":
        tool_calls = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.input)},
            }
            for call in calls
        ]
        reply: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
        if tool_calls:
            reply["tool_calls"] = tool_calls
        chat.append(reply)
    elif texts or not results:
        chat.append({"role": "user", "content": "\n".join(texts)})
    return chat
