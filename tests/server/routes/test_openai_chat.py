"""/v1/chat/completions and /v1/completions through the real `openai` SDK against a running Ferry,
on the tiny onnxruntime-genai model."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import openai
import pytest

from ferry.bench.server_process import TINY_LLM, ferry_server
from ferry.llm.chat_tokenizer import ChatTokenizer
from tests.llm.llm_paths import HF_DIR
from tests.llm.llm_paths import TINY_LLM as TINY_LLM_DIR
from tests.server.conftest import API_SERVERS
from tests.support.llm_configs import tiny_llm_config
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "def fibonacci(n):"}]
# Greedy continuations recorded with transformers (tools/build_tiny_llm.py): the served text
# must match them token for token.
REFERENCE = json.loads((TINY_LLM_DIR / "greedy_reference.json").read_text())


def greedy_text(case: dict[str, Any], tokens: int) -> str:
    return ChatTokenizer(HF_DIR).decode(case["new_ids"][:tokens])


@pytest.fixture(scope="module", params=API_SERVERS)
def server(request):
    with ferry_server(
        llm_models=[tiny_llm_config(max_running=4, max_waiting=16)],
        server={"api_servers": request.param},
    ) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_non_streaming_chat(client):
    case = REFERENCE["cases"][0]
    assert case["messages"] == MESSAGES
    result = client.chat.completions.create(
        model=TINY_LLM, messages=MESSAGES, max_tokens=20, temperature=0
    )
    assert result.id.startswith("chatcmpl-")
    assert result.object == "chat.completion"
    choice = result.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == greedy_text(case, 20)
    assert choice.finish_reason == "length"
    assert result.usage.prompt_tokens == len(case["prompt_ids"])
    assert result.usage.completion_tokens == 20
    assert result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens


def test_max_tokens_gives_finish_reason_length(client):
    result = client.chat.completions.create(
        model=TINY_LLM, messages=MESSAGES, max_completion_tokens=3, temperature=0
    )
    assert result.choices[0].finish_reason == "length"
    assert result.usage.completion_tokens == 3


def test_streaming_with_usage(client):
    stream = client.chat.completions.create(
        model=TINY_LLM,
        messages=MESSAGES,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes in (["stop"], ["length"])
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    full = client.chat.completions.create(
        model=TINY_LLM, messages=MESSAGES, max_tokens=10, temperature=0
    )
    assert text == full.choices[0].message.content


def test_stop_sequence_cuts_the_text(client):
    full = client.completions.create(
        model=TINY_LLM, prompt="import os\n", max_tokens=20, temperature=0
    )
    text = full.choices[0].text
    assert len(text) > 4
    stop = text[2:4]
    cut = client.completions.create(
        model=TINY_LLM, prompt="import os\n", max_tokens=20, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert stop not in cut.choices[0].text
    assert text.startswith(cut.choices[0].text)


def test_n_greater_than_one(client):
    result = client.chat.completions.create(
        model=TINY_LLM, messages=MESSAGES, max_tokens=5, n=3, temperature=0
    )
    assert [c.index for c in result.choices] == [0, 1, 2]
    # Greedy: three independent generations of the same reference text.
    expected = greedy_text(REFERENCE["cases"][0], 5)
    assert [c.message.content for c in result.choices] == [expected] * 3
    assert result.usage.completion_tokens == 15


def test_errors_in_openai_shape(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=TINY_LLM, messages=MESSAGES, temperature=-1)
    assert info.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=TINY_LLM, messages=MESSAGES, max_tokens=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=TINY_LLM, messages=MESSAGES, n=99)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=TINY_LLM, prompt="def " * 5000)
    assert "context" in info.value.message


def test_models_lists_chat_and_embedding_models_generative_first(client):
    ids = [m.id for m in client.models.list().data]
    assert {"tiny-llm", "all-MiniLM-L6-v2"} <= set(ids)
    assert ids[0] == "tiny-llm"  # clients that default to the first model (guidellm) get an LLM


def test_eight_concurrent_requests_complete_and_run_together(server):
    async def scenario() -> list[int]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        running_seen, kv_seen = 0, 0.0

        async def watch() -> None:
            nonlocal running_seen, kv_seen
            async with httpx.AsyncClient() as http:
                while True:
                    text = (await http.get(f"{server.url}/metrics")).text
                    running_seen = max(
                        running_seen, metric_value(text, "ferry_llm_requests_running")
                    )
                    # The inference gateway's KVCacheUtilization rises with the running ones.
                    kv_seen = max(kv_seen, metric_value(text, "ferry_llm_kv_cache_usage_ratio"))
                    await asyncio.sleep(0.005)

        async def one_client() -> int:
            # Several requests in a row keep all eight clients busy long enough for the
            # watcher to look many times (the tiny model decodes a token in well under 1 ms).
            for _ in range(4):
                await client.chat.completions.create(
                    model=TINY_LLM, messages=MESSAGES, max_tokens=40, temperature=0.7
                )
            return 4

        watcher = asyncio.create_task(watch())
        results = await asyncio.gather(*(one_client() for _ in range(8)))
        watcher.cancel()
        await client.close()
        return [sum(results), running_seen, kv_seen]

    completed, running_seen, kv_seen = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert completed == 32
    assert running_seen > 1
    assert 0 < kv_seen <= 1
    # Idle again: no running generation holds KV, whatever the prefix cache keeps. The LoRA
    # info is there with no adapter loaded, and so no room the endpoint picker could count on.
    text = httpx.get(f"{server.url}/metrics").text
    assert metric_value(text, "ferry_llm_requests_running") == 0
    assert metric_value(text, "ferry_llm_kv_cache_usage_ratio", model=TINY_LLM) == 0
    lora_info = dict(model=TINY_LLM, running_lora_adapters="", max_lora="0")
    assert metric_value(text, "ferry_llm_lora_requests_info", **lora_info) > 0


def test_disconnect_mid_stream_stops_generation(server):
    def generated() -> float:
        return metric_value(server.metrics(), "ferry_llm_generation_tokens_total")

    before = generated()
    with httpx.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        json={
            "model": TINY_LLM,
            # Greedy on this prompt repeats "import os" and never stops by itself.
            "messages": REFERENCE["cases"][1]["messages"],
            "max_tokens": 1000,
            "stream": True,
            "temperature": 0,
        },
        timeout=30,
    ) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
    # The connection is closed: the engine must stop generating soon after.
    time.sleep(1.0)
    settled = generated()
    time.sleep(1.0)
    assert generated() == settled
    assert settled - before < 1000
    text = server.metrics()
    assert metric_value(text, "ferry_llm_requests_finished_total", finish_reason="abort") >= 1


def test_disconnect_before_a_full_answer_stops_generation(server):
    """The same for a JSON answer: the gateway cancels the handler when the client leaves."""

    def aborted() -> float:
        text = server.metrics()
        return metric_value(text, "ferry_llm_requests_finished_total", finish_reason="abort")

    before = aborted()
    body = {
        "model": TINY_LLM,
        "messages": REFERENCE["cases"][1]["messages"],  # greedy never stops by itself
        "max_tokens": 1900,
        "temperature": 0,
    }
    # The client leaves long before the answer: the 2-layer model writes its 1900 tokens in
    # about 0.4 s on 2 cores (onnxruntime 1.32), so it gives up after 50 ms of waiting for it
    # (only the read is bounded: a connect or write slowed by a busy box must not end it first).
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server.url}/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=0.05)
        )
    deadline = time.monotonic() + 30
    while aborted() == before:
        assert time.monotonic() < deadline, "the disconnected generation was never aborted"
        time.sleep(0.05)


def test_a_shared_system_prompt_is_reused_and_reported_as_cached(server, client):
    """OpenAI's usage.prompt_tokens_details.cached_tokens, and vLLM's prefix-cache counters."""
    system = {"role": "system", "content": "You write short, plain Python. " * 4}
    chats = [[system, {"role": "user", "content": c}] for c in ("def add(a, b):", "class Stack:")]
    tokenizer = ChatTokenizer(HF_DIR)
    first_ids, second_ids = (tokenizer.encode_chat(m) for m in chats)
    shared = common_prefix(first_ids, second_ids)
    assert shared > 20  # the system prompt and the template around it
    hits_before = metric_value(httpx.get(f"{server.url}/metrics").text, HITS)
    first, second = (
        client.chat.completions.create(model=TINY_LLM, messages=m, max_tokens=4, temperature=0)
        for m in chats
    )
    assert second.usage.prompt_tokens == len(second_ids)
    assert second.usage.prompt_tokens_details.cached_tokens == shared
    assert first.usage.prompt_tokens_details.cached_tokens < shared
    # With API processes a scrape may reach one that has not yet read the engine's report
    # (sent to all before the answer's last delta): it arrives within a loop turn or two.
    deadline = time.monotonic() + 5
    while metric_value(httpx.get(f"{server.url}/metrics").text, HITS) - hits_before < shared:
        assert time.monotonic() < deadline, "the prefix-cache hits never reached /metrics"
        time.sleep(0.05)


HITS = "ferry_llm_prefix_cache_hits_total"


def common_prefix(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
