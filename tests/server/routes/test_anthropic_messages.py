"""POST /v1/messages and /v1/messages/count_tokens through the real `anthropic` SDK against a
running Ferry on the real default chat model: text, system prompts, stop sequences, usage, the
stream's events, forced tool calls (streamed too) and tool results, and refusals in Anthropic's
error shape."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.server.routes.conftest import SMOL as MODEL

pytestmark = pytest.mark.integration

SYSTEM = "You are a terse assistant."
HELLO = [{"role": "user", "content": "Say hello."}]
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED = {"type": "tool", "name": "get_weather"}
# The SDK dropped sampling parameters from its signature; Anthropic's API (and Ferry) take them.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def claude(smol_server):
    return anthropic.Anthropic(base_url=smol_server.url, api_key="unused", max_retries=0)


def test_a_message_is_the_chat_answer_with_its_usage(claude, smol_client):
    message = claude.messages.create(
        model=MODEL, max_tokens=24, system=SYSTEM, messages=HELLO, extra_body=GREEDY
    )
    chat = smol_client.chat.completions.create(
        model=MODEL,
        max_tokens=24,
        extra_body=GREEDY,
        messages=[{"role": "system", "content": SYSTEM}, *HELLO],
    )
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.id.startswith("msg_")
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == chat.choices[0].message.content
    assert (
        message.stop_reason
        == {"stop": "end_turn", "length": "max_tokens"}[chat.choices[0].finish_reason]
    )
    cached = message.usage.cache_read_input_tokens or 0  # the prefix cache's share
    assert message.usage.input_tokens + cached == chat.usage.prompt_tokens
    assert message.usage.output_tokens == chat.usage.completion_tokens
    counted = claude.messages.count_tokens(model=MODEL, system=SYSTEM, messages=HELLO)
    assert counted.input_tokens == chat.usage.prompt_tokens


def test_max_tokens_is_the_stop_reason_when_it_ends_the_answer(claude):
    message = claude.messages.create(model=MODEL, max_tokens=2, messages=HELLO, extra_body=GREEDY)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 2


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_sequence_cuts_the_text_and_is_named(claude, stream):
    text = claude.messages.create(model=MODEL, max_tokens=24, messages=HELLO, extra_body=GREEDY)
    full = text.content[0].text
    stop = full[6:9]
    request = {
        "model": MODEL,
        "max_tokens": 24,
        "messages": HELLO,
        "extra_body": GREEDY,
        "stop_sequences": ["never-said", stop],
    }
    if stream:
        with claude.messages.stream(**request) as events:
            message = events.get_final_message()
    else:
        message = claude.messages.create(**request)
    assert message.content[0].text == full[: full.index(stop)]
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", stop)


def test_the_stream_sends_anthropics_events_in_order(claude):
    with claude.messages.stream(
        model=MODEL, max_tokens=12, system=SYSTEM, messages=HELLO, extra_body=GREEDY
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    created = claude.messages.create(
        model=MODEL, max_tokens=12, system=SYSTEM, messages=HELLO, extra_body=GREEDY
    )
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) <= {"content_block_delta", "text"}  # the SDK adds `text` events
    assert final.content[0].text == created.content[0].text
    assert final.stop_reason == created.stop_reason
    assert final.usage.output_tokens == created.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_call_is_a_tool_use_block(claude, stream):
    request = {
        "model": MODEL,
        "max_tokens": 64,
        "messages": WEATHER_QUESTION,
        "tools": [WEATHER],
        "tool_choice": FORCED,
        # Greedy: at Anthropic's default temperature (1) the arguments may ramble past
        # max_tokens, and what is tested is the block, not the sampling.
        "extra_body": GREEDY,
    }
    if stream:
        with claude.messages.stream(**request) as events:
            kinds = [event.type for event in events]
            message = events.get_final_message()
        assert "input_json" in kinds  # the SDK's event for each input_json_delta
    else:
        message = claude.messages.create(**request)
    assert message.stop_reason == "tool_use"
    [call] = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    assert isinstance(call.input, dict) and isinstance(call.input["city"], str)


def test_a_tool_result_round_trip(claude):
    def ask(messages: list, max_tokens: int, choice: str):
        return claude.messages.create(
            model=MODEL,
            max_tokens=max_tokens,
            messages=messages,
            tools=[WEATHER],
            tool_choice={"type": choice},
            extra_body=GREEDY,
        )

    call = ask(WEATHER_QUESTION, 64, "any")
    history = [
        *WEATHER_QUESTION,
        {"role": "assistant", "content": [block.model_dump() for block in call.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call.content[-1].id,
                    "content": "Sunny, 21 C",
                }
            ],
        },
    ]
    answer = ask(history, 16, "none")
    assert answer.content[0].type == "text" and answer.content[0].text
    counted = claude.messages.count_tokens(model=MODEL, messages=history, tools=[WEATHER])
    assert counted.input_tokens > answer.usage.output_tokens


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"bogus_param": 1}, "bogus_param"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"temperature": 1.5}, "temperature"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "url", "url": "http://x"}}
                        ],
                    }
                ]
            },
            "images, documents and thinking are not supported",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "hi", "colour": 1}]}
                ]
            },
            "messages[0].content[0].colour",
        ),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(claude, smol_server, extra, named):
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model=MODEL, max_tokens=4, messages=HELLO, extra_body=extra)
    assert info.value.status_code == 400
    assert info.value.body["type"] == "error"
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert named in info.value.body["error"]["message"]


def test_an_unknown_model_is_anthropics_not_found(claude, smol_server):
    with pytest.raises(anthropic.NotFoundError) as info:
        claude.messages.create(model="nope", max_tokens=4, messages=HELLO)
    assert info.value.body["error"]["type"] == "not_found_error"
    # Every other /v1 path still answers in OpenAI's shape.
    other = httpx.get(f"{smol_server.url}/v1/nope", timeout=10).json()
    assert "message" in other["error"] and "type" not in other
