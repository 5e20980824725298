"""`POST /v1/responses` on the chat serving path: the request runs as a chat request (same
planning, grammars and engine), and its answer is rendered as a Response, or as the Responses
stream's typed events (`response.created` ... `response.completed`, with `sequence_number`s)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ferry.llm.errors import InvalidSampling
from ferry.server.errors import failure
from ferry.server.openai.planning import plan_chat
from ferry.server.openai.responses_protocol import ResponsesRequest, responses_error
from ferry.server.openai.serving import OpenAIServing
from ferry.server.openai.text_relay import Relayed, relay_text
from ferry.server.openai.tool_stream import CallStream
from ferry.server.registry import ServedLLM
from ferry.server.tenancy import RunAs

_INCOMPLETE = {"length": "max_output_tokens"}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    """One Response: its fixed fields, the output items as they are made, and the usage."""

    def __init__(self, request: ResponsesRequest, model: str) -> None:
        self.request = request
        self.base: dict[str, Any] = {
            "id": _id("resp"),
            "object": "response",
            "created_at": int(time.time()),
            "model": model,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "tool_choice": _tool_choice(request),
            "tools": [t.model_dump(exclude_none=True) for t in request.tools or []],
            "text": {"format": _format(request)},
            "metadata": request.metadata or {},
            "store": False,
            "truncation": "disabled",
            "user": request.user,
            "previous_response_id": None,
            "error": None,
        }
        self.output: list[dict[str, Any]] = []

    def response(
        self, status: str, finish: str | None = None, usage: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        reason = _INCOMPLETE.get(finish or "")
        if status == "completed" and reason is not None:
            status = "incomplete"
        body = {
            **self.base,
            "status": status,
            "incomplete_details": {"reason": reason} if status == "incomplete" else None,
            "output": self.output,
            "usage": None,
        }
        if usage is not None:
            body["usage"] = {
                "input_tokens": usage[0],
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": usage[1],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage[0] + usage[1],
            }
        return body


def message_item(text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "id": _id("msg"),
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content if text or status != "in_progress" else [],
    }


def call_item(name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": _id("fc"),
        "type": "function_call",
        "call_id": f"call_{uuid.uuid4().hex[:24]}",
        "name": name,
        "arguments": arguments,
        "status": status,
    }


async def create_response(
    serving: OpenAIServing,
    request: ResponsesRequest,
    served: ServedLLM | None = None,
    run_as: RunAs | None = None,
) -> dict[str, Any]:
    try:
        chat = await serving.chat(request.to_chat(), served, run_as)
    except InvalidSampling as exc:
        raise responses_error(exc) from None
    choice = chat.choices[0]
    builder = ResponseBuilder(request, chat.model)
    status = "completed"
    if choice.message.tool_calls:
        calls = choice.message.tool_calls
        for i, call in enumerate(calls):  # a call cut by max_output_tokens is the last one
            cut = choice.finish_reason == "length" and i == len(calls) - 1
            item_status = "incomplete" if cut else "completed"
            builder.output.append(
                call_item(call.function.name, call.function.arguments, item_status)
            )
    else:
        item_status = "incomplete" if choice.finish_reason == "length" else "completed"
        builder.output.append(message_item(choice.message.content or "", item_status))
    usage = (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    return builder.response(status, choice.finish_reason, usage)


async def stream_response(
    serving: OpenAIServing,
    request: ResponsesRequest,
    served: ServedLLM | None = None,
    run_as: RunAs | None = None,
) -> AsyncIterator[str]:
    """Start the generation and wait for its first delta, so early errors are HTTP errors."""
    try:
        plan = await plan_chat(
            request.to_chat(), served or serving.resolve(request.model), serving.grammars, run_as
        )
    except InvalidSampling as exc:
        raise responses_error(exc) from None
    deltas = serving.generations(plan)
    try:
        first = await anext(deltas)
    except BaseException:
        await deltas.aclose()
        raise
    builder = ResponseBuilder(request, plan.served.name)
    text_allowed = plan.tools is None or plan.tools.text_allowed
    events = _Events(builder, CallStream(text_allowed) if plan.tools is not None else None)

    async def run() -> AsyncIterator[str]:
        relayed = Relayed()
        yield events.opening()
        try:
            async for event in relay_text(first, deltas, events.text, relayed):
                yield event
        except Exception as exc:
            yield events.failed(exc)
            return
        for event in events.closing(relayed.finish, (plan.prompt_tokens, relayed.tokens)):
            yield event

    return run()


class _Events:
    """The Responses stream's events for one answer: a message, or function calls."""

    def __init__(self, builder: ResponseBuilder, calls: CallStream | None) -> None:
        self._builder = builder
        self._calls = calls  # None: no tools, every piece is text (even one starting with `<`)
        self._sequence = 0
        self._message: dict[str, Any] | None = None
        self._text = ""
        self._open_call: dict[str, Any] | None = None

    def event(self, body: dict[str, Any]) -> str:
        body = {**body, "sequence_number": self._sequence}
        self._sequence += 1
        return f"event: {body['type']}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    def failed(self, exc: BaseException) -> str:
        """A failure after the stream began: OpenAI's `error` event (its `type` is "error"; the
        error's own type is its `code`), then `response.failed`."""
        error = failure(exc)
        return self.event(
            {"type": "error", "code": error.type, "message": error.message, "param": error.param}
        ) + self.event({"type": "response.failed", "response": self._builder.response("failed")})

    def opening(self) -> str:
        response = self._builder.response("in_progress")
        return self.event({"type": "response.created", "response": response}) + self.event(
            {"type": "response.in_progress", "response": response}
        )

    def text(self, text: str) -> list[str]:
        if not text:
            return []
        pieces = [("text", text)] if self._calls is None else self._calls.feed(text)
        return self._pieces(pieces)

    def _pieces(self, pieces: list[tuple[Any, ...]]) -> list[str]:
        events = []
        for piece in pieces:
            if piece[0] == "text":
                events += self._text_delta(piece[1])
            elif piece[0] == "call":
                events += self._close_call()
                self._open_call = call_item(piece[2], "", "in_progress")
                events.append(self._item_event("response.output_item.added", self._open_call))
            else:
                assert self._open_call is not None
                self._open_call["arguments"] += piece[2]
                events.append(
                    self._call_event("response.function_call_arguments.delta", delta=piece[2])
                )
        return events

    def _text_delta(self, text: str) -> list[str]:
        events = []
        if self._message is None:
            self._message = message_item("", "in_progress")
            events.append(self._item_event("response.output_item.added", self._message))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events.append(self._part_event("response.content_part.added", part))
        self._text += text
        events.append(self._part_event("response.output_text.delta", None, delta=text))
        return events

    def closing(self, finish: str | None, usage: tuple[int, int]) -> list[str]:
        events = self._pieces(self._calls.finish()) if self._calls is not None else []
        events += self._close_call("incomplete" if finish == "length" else "completed")
        if self._message is None and (self._calls is None or self._calls.calls == 0):
            events += self._text_delta("")  # an empty answer is still a message
        if self._message is not None:
            status = "incomplete" if finish == "length" else "completed"
            part = {"type": "output_text", "text": self._text, "annotations": [], "logprobs": []}
            events.append(self._part_event("response.output_text.done", None, text=self._text))
            events.append(self._part_event("response.content_part.done", part))
            self._message.update(status=status, content=[part])
            events.append(self._item_event("response.output_item.done", self._message))
        response = self._builder.response("completed", finish, usage)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        events.append(self.event({"type": kind, "response": response}))
        return events

    def _close_call(self, status: str = "completed") -> list[str]:
        call, self._open_call = self._open_call, None
        if call is None:
            return []
        call["status"] = status
        return [
            self._call_event(
                "response.function_call_arguments.done", call=call, arguments=call["arguments"]
            ),
            self._item_event("response.output_item.done", call),
        ]

    def _item_event(self, kind: str, item: dict[str, Any]) -> str:
        if not any(i is item for i in self._builder.output):
            self._builder.output.append(item)
        index = next(i for i, o in enumerate(self._builder.output) if o is item)
        return self.event({"type": kind, "output_index": index, "item": dict(item)})

    def _part_event(self, kind: str, part: dict[str, Any] | None, **fields: Any) -> str:
        assert self._message is not None
        index = next(i for i, o in enumerate(self._builder.output) if o is self._message)
        body = {
            "type": kind,
            "item_id": self._message["id"],
            "output_index": index,
            "content_index": 0,
            **fields,
        }
        if part is not None:
            body["part"] = part
        else:  # the text's delta and done events carry (empty) logprobs
            body["logprobs"] = []
        return self.event(body)

    def _call_event(self, kind: str, call: dict[str, Any] | None = None, **fields: Any) -> str:
        call = call or self._open_call
        assert call is not None
        index = next(i for i, o in enumerate(self._builder.output) if o is call)
        return self.event({"type": kind, "item_id": call["id"], "output_index": index, **fields})


def _tool_choice(request: ResponsesRequest) -> Any:
    choice = request.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump()


def _format(request: ResponsesRequest) -> dict[str, Any]:
    fmt = request.text.format if request.text else None
    if fmt is None:
        return {"type": "text"}
    return fmt.model_dump(by_alias=True, exclude_none=True)
