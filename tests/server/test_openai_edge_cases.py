"""What OpenAI clients send beyond the everyday path, through the real `openai` SDK: token-id
prompts, logprobs and echo, roles beyond system/user/assistant, and parameters Ferry cannot
honour (refused with a 400 naming them, never silently ignored)."""

from __future__ import annotations

import math

import openai
import pytest

from ferry.bench.server_process import TINY_LLM, TINY_LLM_DIR, ferry_server
from ferry.llm.chat_tokenizer import ChatTokenizer
from tests.server.conftest import IN_PROCESS
from tests.support.llm_configs import tiny_llm_config

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "def fibonacci(n):"}]
TOKENIZER = ChatTokenizer(TINY_LLM_DIR)
PROMPT = "import os\n"


# Refusals are decided in the API process; logprobs' and echo's fields over the wire: test_wire.py.
@pytest.fixture(scope="module", params=IN_PROCESS)
def client(request):
    with ferry_server(
        models=[], llm_models=[tiny_llm_config()], server={"api_servers": request.param}
    ) as handle:
        yield openai.OpenAI(base_url=f"{handle.url}/v1", api_key="unused", max_retries=0)


def complete(client, prompt, max_tokens=6, **kwargs):
    return client.completions.create(
        model=TINY_LLM, prompt=prompt, max_tokens=max_tokens, temperature=0, **kwargs
    )


def test_prompt_as_token_ids_equals_prompt_as_text(client):
    ids = TOKENIZER.encode(PROMPT)
    text = complete(client, PROMPT).choices[0].text
    assert complete(client, ids).choices[0].text == text
    batch = complete(client, [ids, TOKENIZER.encode("def f(x):")])
    assert [c.index for c in batch.choices] == [0, 1] and batch.choices[0].text == text


def test_foreign_token_ids_are_refused_naming_the_prompt(client):
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary") as info:
        complete(client, [[5, 6], [5, 10**6]])
    assert info.value.body["param"] == "prompt[1]"


def test_completion_echo_with_logprobs(client):
    ids = TOKENIZER.encode(PROMPT)
    choice = complete(client, PROMPT, echo=True, logprobs=2, max_tokens=3).choices[0]
    plain = complete(client, PROMPT, max_tokens=3).choices[0].text
    assert choice.text == PROMPT + plain
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + 3 and "".join(lp.tokens) == choice.text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert all(len(top) <= 2 for top in lp.top_logprobs[1:])
    # Greedy: each generated token is its position's likeliest.
    for value, top in zip(lp.token_logprobs[-3:], lp.top_logprobs[-3:], strict=True):
        assert value == max(top.values())
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]


def test_chat_logprobs_and_top_logprobs(client):
    result = client.chat.completions.create(
        model=TINY_LLM,
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    choice = result.choices[0]
    content = choice.logprobs.content
    assert "".join(c.token for c in content) == choice.message.content
    for token in content:
        assert len(token.top_logprobs) == 3 and token.top_logprobs[0].token == token.token
        assert bytes(token.bytes).decode() == token.token
        assert sum(math.exp(t.logprob) for t in token.top_logprobs) <= 1 + 1e-9
    plain = client.chat.completions.create(
        model=TINY_LLM, messages=MESSAGES, max_tokens=4, temperature=0
    )
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == choice.message.content


def test_developer_and_tool_roles(client):
    messages = [
        {"role": "developer", "content": "Answer in Python."},
        {"role": "user", "content": "def f(x):"},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]
    result = client.chat.completions.create(model=TINY_LLM, messages=messages, max_tokens=3)
    assert result.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("functions", [{"name": "f", "parameters": {}}]),
        ("function_call", "auto"),
        # onnxruntime-genai has no presence/frequency penalty or logit bias (vLLM has all).
        ("logit_bias", {"5": 10}),
        ("presence_penalty", 0.5),
        ("frequency_penalty", -0.5),
    ],
)
def test_parameters_that_cannot_be_honoured_are_refused(client, param, value):
    with pytest.raises(openai.BadRequestError, match=f"{param} is not supported") as info:
        client.chat.completions.create(
            model=TINY_LLM, messages=MESSAGES, max_tokens=3, extra_body={param: value}
        )
    assert info.value.body["param"] == param


def test_neutral_values_of_those_parameters_are_accepted(client):
    result = client.chat.completions.create(
        model=TINY_LLM,
        messages=MESSAGES,
        max_tokens=3,
        response_format={"type": "text"},
        presence_penalty=0,
        tool_choice="none",
    )
    assert result.choices[0].message.content is not None


def test_streamed_chat_logprobs_equal_the_unstreamed(client):
    args = {"model": TINY_LLM, "messages": MESSAGES, "max_tokens": 5, "temperature": 0}
    full = client.chat.completions.create(**args, logprobs=True, top_logprobs=2)
    chunks = list(
        client.chat.completions.create(**args, logprobs=True, top_logprobs=2, stream=True)
    )
    streamed = [
        t
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert [t.model_dump() for t in streamed] == [
        t.model_dump() for t in full.choices[0].logprobs.content
    ]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content


def test_what_cannot_stream_or_lacks_logprobs_is_refused(client):
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, PROMPT, logprobs=1, stream=True)
    assert info.value.body["param"] == "logprobs"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=TINY_LLM, messages=MESSAGES, top_logprobs=2)
    assert info.value.body["param"] == "top_logprobs"


# What the fuzzer found (tests/server/fuzz_hooks.py used to filter them out):


@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_a_vanishing_temperature_or_top_p_answers_greedy(client, field):
    # 5e-324 is 0 in the runtime's float32 (it refused top_p 0 with a 500): the limit is greedy.
    greedy = complete(client, PROMPT).choices[0].text
    tiny = client.completions.create(model=TINY_LLM, prompt=PROMPT, max_tokens=6, **{field: 5e-324})
    assert tiny.choices[0].text == greedy


@pytest.mark.parametrize(("field", "value"), [("temperature", False), ("top_p", True), ("n", True)])
def test_a_boolean_in_a_number_field_is_a_400_naming_it(client, field, value):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=TINY_LLM, messages=MESSAGES, max_tokens=2, extra_body={field: value}
        )
    assert info.value.body["param"] == field


@pytest.mark.parametrize("prompt", ["", ["x", ""]])
def test_an_empty_prompt_is_a_400_naming_it(client, prompt):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=TINY_LLM, prompt=prompt, max_tokens=2)
    assert info.value.body["param"].startswith("prompt")
