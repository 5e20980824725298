"""OpenAI request/response schemas: ranges name their field, unknown fields pass, shapes match."""

from __future__ import annotations

import logging

import pytest
from openai.types.chat import ChatCompletion
from pydantic import ValidationError

from ferry.llm.base import SamplingSettings
from ferry.server.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
    CompletionRequest,
    ErrorInfo,
    ErrorResponse,
    UsageInfo,
)

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("max_tokens", 0),
        ("max_completion_tokens", -1),
        ("n", 0),
        ("n", 9),
        ("top_p", 0.0),
        ("top_p", 1.5),
    ],
)
def test_out_of_range_values_name_their_field(field: str, value: float) -> None:
    with pytest.raises(ValidationError) as err:
        ChatCompletionRequest(model="m", messages=MESSAGES, **{field: value})
    assert err.value.errors()[0]["loc"] == (field,)


def test_unknown_fields_are_accepted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="ferry.server.openai.protocol"):
        request = ChatCompletionRequest(model="m", messages=MESSAGES, logit_bias={"1": 2})
    assert request.model_extra == {"logit_bias": {"1": 2}}
    assert "logit_bias" in caplog.text


def test_content_parts_are_flattened_to_text() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
        }
    )
    assert request.chat_messages() == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a\nb"},
    ]


def test_unknown_role_is_rejected() -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest(model="m", messages=[{"role": "robot", "content": "x"}])


def test_chat_request_to_sampling() -> None:
    request = ChatCompletionRequest(
        model="m", messages=MESSAGES, max_tokens=7, temperature=0, top_p=0.5, seed=1, stop="\n"
    )
    assert request.to_sampling(100) == SamplingSettings(7, 0.0, 0.5, 1, ("\n",))
    newer = ChatCompletionRequest(
        model="m", messages=MESSAGES, max_completion_tokens=3, max_tokens=7
    )
    assert newer.to_sampling(100).max_tokens == 3
    assert ChatCompletionRequest(model="m", messages=MESSAGES).to_sampling(100).max_tokens == 100


def test_completion_request_prompts_and_defaults() -> None:
    request = CompletionRequest(model="m", prompt=["a", "b"], stop=["x", "y"])
    assert request.prompts() == ["a", "b"]
    assert request.to_sampling() == SamplingSettings(16, 1.0, 1.0, None, ("x", "y"))


def test_response_shape_is_what_the_openai_sdk_parses() -> None:
    response = ChatCompletionResponse(
        model="m",
        choices=[
            ChatCompletionResponseChoice(
                index=0, message=ChatMessage(content="hello"), finish_reason="stop"
            )
        ],
        usage=UsageInfo.of(3, 1),
    )
    assert response.id.startswith("chatcmpl-")
    parsed = ChatCompletion.model_validate(response.model_dump())
    assert parsed.choices[0].message.content == "hello"
    assert parsed.usage is not None and parsed.usage.total_tokens == 4


def test_error_response_shape() -> None:
    body = ErrorResponse(error=ErrorInfo(message="bad", type="BadRequestError", param="n"))
    assert body.model_dump() == {
        "error": {"message": "bad", "type": "BadRequestError", "param": "n", "code": None}
    }
