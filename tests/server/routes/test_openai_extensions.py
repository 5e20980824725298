"""vLLM's sampling extensions and unknown fields on the OpenAI routes, through the real `openai`
SDK (`extra_body=`) against a running Ferry on the real default chat model: each extension is
honoured, and a field Ferry does not know is a 400 naming it, as OpenAI answers."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.server.routes.conftest import SMOL as MODEL

pytestmark = pytest.mark.integration

GREETING = [{"role": "user", "content": "Say hello."}]


def chat(client: openai.OpenAI, **extra: Any) -> Any:
    body = {"temperature": 0, "max_tokens": 24, **extra}
    named = {k: body.pop(k) for k in ("temperature", "max_tokens", "seed", "stream") if k in body}
    return client.chat.completions.create(model=MODEL, messages=GREETING, extra_body=body, **named)


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda c: chat(c, bogus_param=1), "bogus_param"),
        (
            lambda c: c.completions.create(model=MODEL, prompt="x", extra_body={"bogus_param": 1}),
            "bogus_param",
        ),
        (
            lambda c: c.responses.create(model=MODEL, input="x", extra_body={"bogus_param": 1}),
            "bogus_param",
        ),
        (
            lambda c: c.embeddings.create(model=MODEL, input="x", extra_body={"bogus_param": 1}),
            "bogus_param",
        ),
        (
            lambda c: c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x", "colour": "red"}]
            ),
            "messages[0].colour",
        ),
        (lambda c: chat(c, stream_options={"include_usage": True, "x": 1}), "stream_options.x"),
        (lambda c: chat(c, best_of=2), "best_of"),  # OpenAI's, not honoured: refused by name
    ],
)
def test_an_unknown_field_is_a_400_naming_it(smol_client, call, param):
    with pytest.raises(openai.BadRequestError) as info:
        call(smol_client)
    assert info.value.status_code == 400
    assert info.value.body["param"] == param
    assert param in info.value.body["message"]


def test_top_k_one_at_temperature_one_is_greedy(smol_client):
    greedy = chat(smol_client).choices[0].message.content
    for seed in range(3):
        sampled = chat(smol_client, temperature=1.0, seed=seed, top_k=1)
        assert sampled.choices[0].message.content == greedy


def test_min_p_one_at_temperature_one_is_greedy(smol_client):
    greedy = chat(smol_client).choices[0].message.content
    assert (
        chat(smol_client, temperature=1.0, seed=1, min_p=1.0).choices[0].message.content == greedy
    )


def test_ignore_eos_generates_max_tokens(smol_client):
    short = chat(smol_client, max_tokens=200)
    assert short.choices[0].finish_reason == "stop"  # the model ends the greeting itself
    ended = short.usage.completion_tokens
    longer = chat(smol_client, max_tokens=ended + 8, ignore_eos=True)
    assert longer.choices[0].finish_reason == "length"
    assert longer.usage.completion_tokens == ended + 8
    assert longer.choices[0].message.content.startswith(short.choices[0].message.content)


def test_min_tokens_holds_the_end_back(smol_client):
    ended = chat(smol_client, max_tokens=200).usage.completion_tokens
    held = chat(smol_client, max_tokens=ended + 6, min_tokens=ended + 3)
    assert held.usage.completion_tokens >= ended + 3


def test_stop_token_ids_end_the_generation(smol_client, smol_server):
    text = chat(smol_client, max_tokens=200).choices[0].message.content
    body = {"model": MODEL, "prompt": text, "add_special_tokens": False}
    tokens = httpx.post(f"{smol_server.url}/tokenize", json=body, timeout=30).json()["tokens"]
    stopped = chat(smol_client, max_tokens=200, stop_token_ids=[tokens[3]])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens == 3  # the stop token is neither counted nor sent
    assert text.startswith(stopped.choices[0].message.content)


@pytest.mark.parametrize("stream", [False, True])
def test_include_stop_str_in_output_keeps_the_stop_string(smol_client, stream):
    text = chat(smol_client).choices[0].message.content
    stop = text[5:9]
    request = {"stop": [stop], "include_stop_str_in_output": True}
    if stream:
        chunks = chat(smol_client, stream=True, **request)
        kept = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        kept = chat(smol_client, **request).choices[0].message.content
    assert kept == text[: text.index(stop) + len(stop)]


def test_what_the_engine_cannot_honour_with_a_grammar_is_refused(smol_client):
    with pytest.raises(openai.BadRequestError) as info:
        chat(smol_client, ignore_eos=True, response_format={"type": "json_object"})
    assert info.value.body["param"] == "ignore_eos"
