"""OpenAI request/response schemas: ranges name their field, unknown fields are refused, shapes
match."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletion
from pydantic import ValidationError

from ferry.llm.base import SamplingSettings
from ferry.llm.errors import InvalidSampling
from ferry.server.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
    CompletionRequest,
    UsageInfo,
)
from ferry.server.schemas import ErrorInfo, ErrorResponse

pytestmark = pytest.mark.unit

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
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.1),
        ("repetition_penalty", 0.0),
        ("seed", 2**63),
        ("seed", -(2**63) - 1),
    ],
)
def test_out_of_range_values_name_their_field(field: str, value: float) -> None:
    with pytest.raises(ValidationError) as err:
        ChatCompletionRequest(model="m", messages=MESSAGES, **{field: value})
    assert err.value.errors()[0]["loc"] == (field,)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", False),
        ("top_p", True),
        ("temperature", "0.5"),
        ("n", True),
        ("n", 2.0),
        ("seed", False),
        ("max_tokens", True),
        ("max_completion_tokens", "5"),
        ("top_logprobs", False),
        ("stream", 1),
        ("logprobs", "true"),
        ("presence_penalty", False),
        ("frequency_penalty", True),
        ("repetition_penalty", "1.2"),
    ],
)
def test_numbers_and_booleans_are_strict(field: str, value: object) -> None:
    # Lax mode would run `false` as temperature 0 and "0.5" as 0.5: not what the client wrote.
    with pytest.raises(ValidationError) as err:
        ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES, field: value})
    assert err.value.errors()[0]["loc"] == (field,)


@pytest.mark.parametrize(
    ("field", "value"), [("max_tokens", False), ("logprobs", True), ("echo", 1)]
)
def test_completion_numbers_and_booleans_are_strict(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as err:
        CompletionRequest.model_validate({"model": "m", "prompt": "hi", field: value})
    assert err.value.errors()[0]["loc"] == (field,)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("temperature", float("nan"), "finite number"),
        ("top_p", float("nan"), "finite number"),
        ("temperature", float("inf"), "finite number"),
        ("stop", ["s"] * 17, "at most 16 stop strings; got 17"),
        ("stop", "s" * 257, "stop string 0 has 257 characters"),
        ("stop", ["ok", ""], "stop string 1 has 0 characters"),
    ],
)
def test_messages_say_what_is_wrong(field: str, value: object, says: str) -> None:
    with pytest.raises(ValidationError) as err:
        CompletionRequest(model="m", prompt="x", **{field: value})
    assert err.value.errors()[0]["loc"] == (field,)
    assert says in err.value.errors()[0]["msg"]


@pytest.mark.parametrize("seed", [-1, 0, 2**63 - 1, -(2**63)])
def test_any_int64_seed_is_taken_as_vllm_and_openai_take_it(seed: int) -> None:
    request = CompletionRequest(model="m", prompt="x", seed=seed, stop=["s"] * 16)
    assert request.to_sampling(100).seed == seed


def test_integers_still_pass_as_numbers() -> None:
    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": MESSAGES, "temperature": 1, "top_p": 1, "n": 2}
    )
    assert (request.temperature, request.top_p, request.n) == (1.0, 1.0, 2)


@pytest.mark.parametrize(
    ("field", "value", "refused"),
    [
        ("best_of", True, True),
        ("best_of", 1, False),
    ],
)
def test_a_boolean_is_not_a_neutral_number(field: str, value: object, refused: bool) -> None:
    body = {"model": "m", "messages": MESSAGES, field: value}
    if refused:
        with pytest.raises(InvalidSampling) as err:
            ChatCompletionRequest.model_validate(body)
        assert err.value.field == field
    else:
        ChatCompletionRequest.model_validate(body).check_supported()


@pytest.mark.parametrize(
    ("settings", "greedy"),
    [
        (SamplingSettings(temperature=0.0), True),
        (SamplingSettings(temperature=5e-324), True),
        (SamplingSettings(top_p=5e-324), True),
        (SamplingSettings(temperature=1e-3, top_p=1e-3), False),
        (SamplingSettings(), False),
    ],
)
def test_a_vanishing_temperature_or_top_p_runs_greedy(
    settings: SamplingSettings, greedy: bool
) -> None:
    assert settings.greedy is greedy


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"bogus_param": 1}, ("bogus_param",)),
        ({"messages": [{"role": "user", "content": "hi", "x": 1}]}, ("messages", 0, "x")),
        ({"stream_options": {"include_usage": True, "y": 2}}, ("stream_options", "y")),
    ],
)
def test_unknown_fields_are_refused_where_they_are(body: dict, where: tuple) -> None:
    with pytest.raises(ValidationError) as err:
        ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES, **body})
    error = next(e for e in err.value.errors() if e["type"] == "extra_forbidden")
    assert error["loc"] == where


def test_vllm_sampling_extensions_become_engine_settings() -> None:
    request = CompletionRequest.model_validate(
        {
            "model": "m",
            "prompt": "x",
            "max_tokens": 8,
            "top_k": 5,
            "min_p": 0.1,
            "min_tokens": 3,
            "ignore_eos": True,
            "stop_token_ids": [7],
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
        }
    )
    settings = request.to_sampling()
    assert (settings.top_k, settings.min_p, settings.min_tokens) == (5, 0.1, 3)
    assert settings.ignore_eos and settings.include_stop_str_in_output
    assert settings.stop_token_ids == (7,) and not settings.skip_special_tokens
    assert set(settings.requested_options()) == {
        "top_k",
        "min_p",
        "min_tokens",
        "ignore_eos",
        "stop_token_ids",
        "include_stop_str_in_output",
        "skip_special_tokens",
    }
    assert CompletionRequest(model="m", prompt="x", top_k=-1).to_sampling().top_k == 0


def test_min_tokens_past_max_tokens_is_refused() -> None:
    with pytest.raises(InvalidSampling) as err:
        CompletionRequest(model="m", prompt="x", max_tokens=2, min_tokens=3).to_sampling()
    assert err.value.field == "min_tokens"


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


def test_a_calls_arguments_reach_the_template_as_an_object() -> None:
    """As vLLM hands them to apply_chat_template: a template's `arguments | tojson` would
    otherwise quote the JSON text again. Empty is `{}`; text that is not JSON stays text."""
    deep = "[" * 5000 + "]" * 5000  # /tokenize renders without the chat route's depth check
    texts = ['{"place": {"city": "Zürich"}, "units": ["c"]}', "", "not json", deep]
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": text}}
        for i, text in enumerate(texts)
    ]
    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "assistant", "tool_calls": calls}]}
    )
    (message,) = request.chat_messages()
    assert [call["function"]["arguments"] for call in message["tool_calls"]] == [
        {"place": {"city": "Zürich"}, "units": ["c"]},
        {},
        "not json",
        deep,
    ]
    assert message["tool_calls"][0] == {
        "id": "c0",
        "type": "function",
        "function": {"name": "f", "arguments": {"place": {"city": "Zürich"}, "units": ["c"]}},
    }


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


def test_penalties_and_logit_bias_reach_the_settings() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": MESSAGES,
            "presence_penalty": 0.5,
            "frequency_penalty": -1,
            "repetition_penalty": 1.3,
            "logit_bias": {"42": -100, "7": 5},
        }
    )
    sampling = request.to_sampling(16)
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -1.0)
    assert sampling.repetition_penalty == 1.3
    assert sampling.logit_bias == ((7, 5.0), (42, -100.0))
    assert sampling.requested_options() == [
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
    ]


def test_neutral_penalties_request_nothing() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": MESSAGES,
            "presence_penalty": 0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1,
            "logit_bias": {},
        }
    )
    assert request.to_sampling(16).requested_options() == []


@pytest.mark.parametrize("key", ["hello", "-1", "1.5", ""])
def test_logit_bias_keys_must_be_token_ids(key: str) -> None:
    request = CompletionRequest(model="m", prompt="hi", logit_bias={key: 1.0})
    with pytest.raises(InvalidSampling) as err:
        request.to_sampling()
    assert err.value.field == "logit_bias"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("logit_bias", {"1": 100.5}),
        ("repetition_penalty", float("inf")),
        ("repetition_penalty", 1e300),  # float32: inf
        ("repetition_penalty", 1e-300),  # float32: 0
        ("presence_penalty", -2.5),
        ("frequency_penalty", float("nan")),
    ],
)
def test_engine_ranges_are_checked_by_the_schema_and_name_their_field(
    field: str, value: object
) -> None:
    """The one place sampling ranges are checked: SamplingSettings is built from this."""
    with pytest.raises(ValidationError) as err:
        CompletionRequest.model_validate({"model": "m", "prompt": "hi", field: value})
    assert err.value.errors()[0]["loc"][0] == field


@pytest.mark.parametrize(
    ("field", "value"),
    [("guided_regex", ""), ("guided_grammar", ""), ("guided_choice", ["a", ""])],
)
def test_a_grammar_that_allows_only_empty_output_is_refused(field: str, value: object) -> None:
    # onnxruntime-genai failed these with a 500 (empty guidance data; a mask after the stop).
    with pytest.raises(ValidationError) as err:
        CompletionRequest.model_validate({"model": "m", "prompt": "hi", field: value})
    assert err.value.errors()[0]["loc"][0] == field
