"""Tool calls read from a choice's text: as it arrives, sent as OpenAI's incremental
`delta.tool_calls` (the first piece of a call carries its id, type and name, the next ones its
arguments), which the SDK's stream helpers and langchain reassemble; or whole, for an answer
that is not streamed. Both read with the one CallStream, so they give the same calls. Text
chosen under `auto` is content, as without tools.

A call cut short by `max_tokens` (finish_reason `length`) is still a call once its name is
whole: its arguments are what the model wrote of them (not valid JSON). A call cut inside its
name is dropped. The `<tool_call>` markup is never content."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from typing import Any

from ferry.llm.base import GenerationDelta
from ferry.server.openai.chunks import StreamChunks
from ferry.server.openai.protocol import (
    ChatCompletionStreamChoice,
    DeltaMessage,
    FinishReasonField,
    UsageInfo,
)
from ferry.server.openai.tool_models import DeltaFunctionCall, DeltaToolCall
from ferry.server.openai.tools import CLOSE, OPEN

# A call's head, up to where its arguments begin (compact JSON, name first: the grammar's order).
_HEAD = re.compile(r"\n?" + re.escape(OPEN) + r'\{"name":("(?:[^"\\]|\\.)*"),"arguments":')
_END = "}" + CLOSE  # the call object's brace, then the closing tag


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class CallStream:
    """One choice's text -> ("text", s) | ("call", index, name) | ("arguments", index, s)."""

    def __init__(self, text_allowed: bool) -> None:
        self._mode = None if text_allowed else "calls"  # None until the first character
        self._pending = ""
        self._arguments: str | None = None  # the open call's arguments so far; None: no call
        self.calls = 0  # calls begun

    def feed(self, text: str) -> list[tuple[Any, ...]]:
        if self._mode is None and text:
            self._mode = "calls" if text.startswith("<") else "text"
        if self._mode != "calls":
            return [("text", text)] if text else []
        self._pending += text
        pieces: list[tuple[Any, ...]] = []
        while True:
            if self._arguments is None:
                head = _HEAD.match(self._pending)
                if head is None:
                    return pieces
                pieces.append(("call", self.calls, json.loads(head.group(1))))
                self.calls += 1
                self._arguments, self._pending = "", self._pending[head.end() :]
            done = self._close_call()
            if done is None:
                break
            if done:
                pieces.append(("arguments", self.calls - 1, done))
        # Hold back what could be the start of the closing `}</tool_call>`.
        safe = len(self._pending) - (len(_END) - 1)
        if safe > 0 and self._arguments is not None:
            piece, self._pending = self._pending[:safe], self._pending[safe:]
            self._arguments += piece
            pieces.append(("arguments", self.calls - 1, piece))
        return pieces

    def finish(self) -> list[tuple[Any, ...]]:
        """The rest of a call cut short: its held-back arguments, without a partial closing
        `}</tool_call>` after arguments that are already whole."""
        if self._arguments is None or not self._pending:
            return []
        rest, self._pending = self._pending, ""
        for end in range(len(rest)):
            if _END.startswith(rest[end:]) and _is_json(self._arguments + rest[:end]):
                rest = rest[:end]
                break
        self._arguments += rest
        return [("arguments", self.calls - 1, rest)] if rest else []

    def _close_call(self) -> str | None:
        """The rest of the open call's arguments if the call is complete in what is pending:
        the first `}</tool_call>` after which the arguments are whole JSON (a string value may
        hold that text too)."""
        assert self._arguments is not None
        at = self._pending.find(_END)
        while at >= 0:
            rest = self._pending[:at]
            try:
                json.loads(self._arguments + rest)
            except (ValueError, RecursionError):  # not whole JSON yet, or deeper than Python reads
                at = self._pending.find(_END, at + 1)
                continue
            self._arguments, self._pending = None, self._pending[at + len(_END) :]
            return rest
        return None


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def read_calls(texts: Iterable[str], text_allowed: bool) -> tuple[str, list[tuple[str, str]]]:
    """The text and the (name, arguments JSON) calls of an answer, given in pieces (a whole
    answer is one piece), as its stream gives them."""
    stream = CallStream(text_allowed)
    content, calls = "", []
    pieces = [piece for text in texts for piece in stream.feed(text)]
    for piece in [*pieces, *stream.finish()]:
        if piece[0] == "text":
            content += piece[1]
        elif piece[0] == "call":
            calls.append([piece[2], ""])
        else:
            calls[piece[1]][1] += piece[2]
    return content, [(name, arguments) for name, arguments in calls]


class ToolChunks:
    """StreamChunks for a chat stream whose choices may answer with calls."""

    def __init__(self, chunks: StreamChunks, n: int, text_allowed: bool) -> None:
        self._chunks = chunks
        self._streams = [CallStream(text_allowed) for _ in range(n)]
        self.opening = chunks.opening

    def delta(self, index: int, delta: GenerationDelta) -> str:
        stream = self._streams[index]
        events = []
        pieces = stream.feed(delta.text)
        if delta.finish_reason is not None:
            pieces += stream.finish()
        for piece in pieces:
            if piece[0] == "text":
                events.append(self._chunks.delta(index, GenerationDelta(piece[1], 0)))
            else:
                events.append(self._call_event(index, piece))
        if delta.finish_reason is not None:
            reason: FinishReasonField = delta.finish_reason
            if stream.calls and reason == "stop":
                reason = "tool_calls"
            events.append(self._chunks.delta(index, GenerationDelta("", 0, reason)))  # type: ignore[arg-type]  # chat's own tool_calls rides on the delta
        return "".join(events)

    def _call_event(self, index: int, piece: tuple[Any, ...]) -> str:
        kind, call, value = piece
        if kind == "call":
            tool_call = DeltaToolCall(
                index=call,
                id=new_call_id(),
                type="function",
                function=DeltaFunctionCall(name=value, arguments=""),
            )
        else:
            tool_call = DeltaToolCall(index=call, function=DeltaFunctionCall(arguments=value))
        choice = ChatCompletionStreamChoice(index=index, delta=DeltaMessage(tool_calls=[tool_call]))
        return self._chunks.event([choice])

    def usage(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
    ) -> str:
        return self._chunks.usage(prompt_tokens, completion_tokens, cached_tokens)

    def running_usage(self, usage: UsageInfo) -> None:
        self._chunks.running_usage(usage)
