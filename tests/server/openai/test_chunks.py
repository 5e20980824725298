"""The OpenAI render path in-process (server/openai/chunks.py, sse.py and the serving layer's
rendering), on the real tiny LLM: streamed events frame what the unstreamed answer holds, in
OpenAI's shape, and the fast text template writes the bytes the pydantic path would."""

from __future__ import annotations

import json

import pytest
import pytest_asyncio

from ferry.bench.server_process import TINY_LLM
from ferry.server.openai.protocol import (
    ChatCompletionChunk,
    ChatCompletionStreamChoice,
    DeltaMessage,
    dump_chunk,
)
from ferry.server.openai.sse import DONE, TextTemplate, sse_data
from ferry.server.settings import Settings
from tests.server.inprocess import serving
from tests.support.llm_configs import tiny_llm_config

pytestmark = pytest.mark.integration

# One engine for the module: the tests share its loop.
in_module_loop = pytest.mark.asyncio(loop_scope="module")

MESSAGES = [{"role": "user", "content": "def fibonacci(n):"}]
GREEDY = {"model": TINY_LLM, "temperature": 0, "max_tokens": 12}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def client():
    async with serving(Settings(models=[], llm_models=[tiny_llm_config()])) as http:
        yield http


def events(body: str) -> list[dict]:
    """The JSON payloads of an SSE body, checking its framing and the closing [DONE]."""
    assert body.endswith(DONE)
    frames = body[: -len(DONE)].split("\n\n")
    assert frames[-1] == ""
    payloads = []
    for frame in frames[:-1]:
        assert frame.startswith("data: ") and "\n" not in frame
        payloads.append(json.loads(frame[len("data: ") :]))
    return payloads


async def post(client, path: str, body: dict):
    response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response


@in_module_loop
async def test_a_streamed_chat_frames_the_unstreamed_answer(client):
    # A prompt no other test of the module sends: its first request finds less of it cached
    # than the repeat does, whichever tests ran before on the module's engine.
    body = {**GREEDY, "messages": [{"role": "user", "content": "def fibonacci_framed(n):"}]}
    full = (await post(client, "/v1/chat/completions", body)).json()
    streamed = await post(
        client,
        "/v1/chat/completions",
        {**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert streamed.headers["content-type"].startswith("text/event-stream")
    chunks = events(streamed.text)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["model"] == TINY_LLM
    # OpenAI's order: the role first, text deltas, the finish reason, then usage alone.
    assert chunks[0]["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    *deltas, last = chunks[1:]
    assert last["choices"] == []
    # The same usage, except that the repeated prompt was now found in the prefix cache.
    cached = last["usage"].pop("prompt_tokens_details")["cached_tokens"]
    assert full["usage"].pop("prompt_tokens_details")["cached_tokens"] < cached
    assert last["usage"] == full["usage"]
    assert all("usage" not in c for c in chunks[:-1])
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in deltas)
    assert text == full["choices"][0]["message"]["content"]
    reasons = [c["choices"][0]["finish_reason"] for c in deltas]
    # Deltas the engine made while nobody read may arrive merged: one event or many.
    assert reasons[-1] == full["choices"][0]["finish_reason"]
    assert all(reason is None for reason in reasons[:-1])
    assert all(None not in c["choices"][0]["delta"].values() for c in deltas)


@in_module_loop
async def test_streamed_completions_keep_each_choice_apart(client):
    body = {**GREEDY, "prompt": ["import os\n", "def f(x):"]}
    full = (await post(client, "/v1/completions", body)).json()
    chunks = events((await post(client, "/v1/completions", {**body, "stream": True})).text)
    assert {c["object"] for c in chunks} == {"text_completion"}
    texts, finished = {0: "", 1: ""}, {}
    for chunk in chunks:
        (choice,) = chunk["choices"]  # one choice per event, tagged with its index
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"] is not None:
            assert choice["index"] not in finished  # each choice finishes once
            finished[choice["index"]] = choice["finish_reason"]
    assert texts == {c["index"]: c["text"] for c in full["choices"]}
    assert finished == {c["index"]: c["finish_reason"] for c in full["choices"]}


@in_module_loop
async def test_streamed_chat_logprobs_are_the_unstreamed_ones(client):
    body = {**GREEDY, "messages": MESSAGES, "logprobs": True, "top_logprobs": 2}
    full = (await post(client, "/v1/chat/completions", body)).json()
    chunks = events((await post(client, "/v1/chat/completions", {**body, "stream": True})).text)
    streamed = [
        entry
        for c in chunks
        for choice in c["choices"]
        if choice["logprobs"]
        for entry in choice["logprobs"]["content"]
    ]
    assert streamed == full["choices"][0]["logprobs"]["content"]
    assert all(len(e["top_logprobs"]) == 2 for e in streamed)


@pytest.mark.parametrize("text", ["plain", 'quote " and \\ backslash', "line\nbreak", "é ✓ 😀", ""])
def test_the_text_template_writes_what_pydantic_writes(text):
    def chunk(content: str) -> dict:
        choice = ChatCompletionStreamChoice(index=3, delta=DeltaMessage(content=content))
        return dump_chunk(ChatCompletionChunk(id="c1", created=7, model="m", choices=[choice]))

    template = TextTemplate(chunk(TextTemplate.SENTINEL))
    assert template.fill(text) == sse_data(chunk(text))
