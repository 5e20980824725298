"""`POST /v1/messages` and `/v1/messages/count_tokens` on the chat serving path: the request runs
as a chat request (same planning, grammars and engine), and its answer is rendered as an
Anthropic message, or as its stream's events (`message_start`, `content_block_start` /
`_delta` / `_stop` per text or tool_use block, `message_delta` with the stop reason and usage,
`message_stop`; an error after the stream began is an `error` event).

Stop sequences run with `include_stop_str_in_output`; the matched one is cut here by a
StopMatcher of its own, so the answer says which one ended it (`stop_sequence`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ferry.llm.stops import StopMatcher
from ferry.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from ferry.server.dialects import ANTHROPIC
from ferry.server.errors import failure
from ferry.server.openai.planning import plan_chat
from ferry.server.openai.serving import OpenAIServing
from ferry.server.openai.text_relay import Relayed, relay_text
from ferry.server.openai.tool_stream import CallStream
from ferry.server.registry import ServedLLM
from ferry.server.tenancy import RunAs


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def stop_reason(finish: str | None, matched: str | None, calls: int) -> str:
    if finish == "length":
        return "max_tokens"
    if matched is not None:
        return "stop_sequence"
    return "tool_use" if calls else "end_turn"


def usage(prompt_tokens: int, output_tokens: int, cached: int | None) -> dict[str, int]:
    """Anthropic's count: `input_tokens` are those not read from the cache."""
    body = {"input_tokens": prompt_tokens - (cached or 0), "output_tokens": output_tokens}
    if cached is not None:
        body |= {"cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}
    return body


def _input(arguments: str) -> Any:
    """A call's arguments as its `input` object; a call cut by max_tokens (not JSON yet) has
    none (its stop_reason says why)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


async def create_message(
    serving: OpenAIServing,
    request: MessagesRequest,
    served: ServedLLM | None = None,
    run_as: RunAs | None = None,
) -> dict[str, Any]:
    chat = await serving.chat(request.chat(), served, run_as)
    choice = chat.choices[0]
    stops = StopMatcher(tuple(request.stop_sequences or ()))
    text = stops.feed(choice.message.content or "") + stops.flush()
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    calls = choice.message.tool_calls or []
    for call in calls:
        block = {"type": "tool_use", "id": _id("toolu"), "name": call.function.name}
        content.append({**block, "input": _input(call.function.arguments)})
    details = chat.usage.prompt_tokens_details
    return {
        "id": _id("msg"),
        "type": "message",
        "role": "assistant",
        "model": chat.model,
        "content": content,
        "stop_reason": stop_reason(choice.finish_reason, stops.matched, len(calls)),
        "stop_sequence": stops.matched,
        "usage": usage(
            chat.usage.prompt_tokens,
            chat.usage.completion_tokens,
            None if details is None else details.cached_tokens,
        ),
    }


async def count_tokens(
    serving: OpenAIServing, request: CountTokensRequest, served: ServedLLM | None = None
) -> dict[str, int]:
    """The prompt's tokens as the chat path renders it (template, tools); nothing is run."""
    chat = request.to_chat(max_tokens=1)
    plan = await plan_chat(chat, served or serving.resolve(request.model), serving.grammars)
    return {"input_tokens": plan.prompt_tokens}


async def stream_message(
    serving: OpenAIServing,
    request: MessagesRequest,
    served: ServedLLM | None = None,
    run_as: RunAs | None = None,
) -> AsyncIterator[str]:
    """Start the generation and wait for its first delta, so early errors are HTTP errors."""
    plan = await plan_chat(
        request.chat(), served or serving.resolve(request.model), serving.grammars, run_as
    )
    deltas = serving.generations(plan)
    try:
        first = await anext(deltas)
    except BaseException:
        await deltas.aclose()
        raise
    text_allowed = plan.tools is None or plan.tools.text_allowed
    events = _Events(
        StopMatcher(tuple(request.stop_sequences or ())),
        CallStream(text_allowed) if plan.tools is not None else None,
    )
    cached = first[1].cached_tokens

    async def run() -> AsyncIterator[str]:
        relayed = Relayed()
        yield events.opening(_id("msg"), plan.served.name, usage(plan.prompt_tokens, 0, cached))
        try:
            async for event in relay_text(first, deltas, events.text, relayed):
                yield event
        except Exception as exc:
            yield events.failed(exc)
            return
        for event in events.closing(relayed.finish, relayed.tokens):
            yield event

    return run()


def sse(body: dict[str, Any]) -> str:
    return f"event: {body['type']}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"


class _Events:
    """One answer's content blocks as stream events: text blocks and tool_use blocks, each
    opened, filled with deltas and closed in turn."""

    def __init__(self, stops: StopMatcher, calls: CallStream | None) -> None:
        self._stops = stops
        self._calls = calls  # None: no tools, every piece is text (even one starting with `<`)
        self._index = -1  # the open block's; -1 before the first
        self._open: str | None = None  # the open block's type

    def opening(self, message_id: str, model: str, counts: dict[str, int]) -> str:
        message: dict[str, Any] = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": counts,
        }
        return sse({"type": "message_start", "message": message})

    def failed(self, exc: BaseException) -> str:
        error = ANTHROPIC.body(failure(exc))
        return sse(error)

    def text(self, text: str) -> list[str]:
        text = self._stops.feed(text)
        return self._pieces(self._split(text))

    def _split(self, text: str) -> list[tuple[Any, ...]]:
        if not text:
            return []
        return [("text", text)] if self._calls is None else self._calls.feed(text)

    def _pieces(self, pieces: list[tuple[Any, ...]]) -> list[str]:
        events = []
        for piece in pieces:
            if piece[0] == "text":
                if self._open != "text":
                    events += self._start({"type": "text", "text": ""})
                delta = {"type": "text_delta", "text": piece[1]}
            elif piece[0] == "call":
                block = {"type": "tool_use", "id": _id("toolu"), "name": piece[2], "input": {}}
                events += self._start(block)
                continue
            else:
                delta = {"type": "input_json_delta", "partial_json": piece[2]}
            events.append(
                sse({"type": "content_block_delta", "index": self._index, "delta": delta})
            )
        return events

    def _start(self, block: dict[str, Any]) -> list[str]:
        events = self._stop()
        self._index += 1
        self._open = block["type"]
        events.append(
            sse({"type": "content_block_start", "index": self._index, "content_block": block})
        )
        return events

    def _stop(self) -> list[str]:
        if self._open is None:
            return []
        self._open = None
        return [sse({"type": "content_block_stop", "index": self._index})]

    def closing(self, finish: str | None, output_tokens: int) -> list[str]:
        events = self._pieces(self._split(self._stops.flush()))
        if self._calls is not None:
            events += self._pieces(self._calls.finish())
        events += self._stop()
        calls = self._calls.calls if self._calls is not None else 0
        matched = self._stops.matched
        delta = {"stop_reason": stop_reason(finish, matched, calls), "stop_sequence": matched}
        events.append(
            sse(
                {"type": "message_delta", "delta": delta, "usage": {"output_tokens": output_tokens}}
            )
        )
        events.append(sse({"type": "message_stop"}))
        return events
