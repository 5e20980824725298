"""The architecture matrix: a tiny random-weight model of each architecture the README lists as
exportable (tests/exporters/tiny_llms.py), exported by `ferry export llm`'s builder and checks
(all in one builder process, tests/exporters/conftest.py) and served together by one real
server. Each answers greedily with onnxruntime-genai's own Generator's text, makes a forced tool
call the openai client parses, and answers a json_schema with JSON that validates."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from ferry.bench.server_process import FerryProcess, ferry_server
from ferry.llm.chat_tokenizer import ChatTokenizer
from tests.exporters.tiny_llms import MATRIX, WINDOW
from tests.llm.reference_og import eos_ids, greedy

pytestmark = pytest.mark.integration

NAMES = list(MATRIX)
MAX_TOKENS = 12
QUESTION = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What time is it in Paris, and is it raining there right now?"},
]
ZONE = {"type": "string", "enum": ["UTC", "CET"]}
TIME_PARAMETERS = {
    "type": "object",
    "properties": {"zone": ZONE, "exact": {"type": "boolean"}},
    "required": ["zone", "exact"],
    "additionalProperties": False,
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time", "parameters": TIME_PARAMETERS},
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather at <city & country>, «précis»",
        "parameters": {
            "type": "object",
            "properties": {
                "place": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
                    "required": ["city"],
                },
                "units": {"type": "array", "items": {"enum": ["celsius", "fahrenheit"]}},
            },
            "required": ["place"],
        },
    },
}
TOOLS = [WEATHER_TOOL, TIME_TOOL]
WEATHER_ARGUMENTS = {"place": {"city": "Zürich", "country": "CH"}, "units": ["celsius"]}
# Mistral's template wants call ids of 9 characters.
TEMPLATE_CALL = {
    "id": "call12345",
    "type": "function",
    "function": {"name": "get_weather", "arguments": WEATHER_ARGUMENTS},
}
# An agent loop's second call, as the openai client sends it: arguments are JSON text.
HISTORY = [
    *QUESTION,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                **TEMPLATE_CALL,
                "function": {"name": "get_weather", "arguments": json.dumps(WEATHER_ARGUMENTS)},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call12345", "content": '{"raining": true, "sky": "<grey>"}'},
]
RAIN_SCHEMA = {
    "type": "object",
    "properties": {"raining": {"type": "boolean"}, "zone": ZONE},
    "required": ["raining", "zone"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(tiny_llm_exports: dict[str, tuple[Path, Path]]) -> Iterator[FerryProcess]:
    models = [
        {"name": name, "engine": "ortgenai", "path": str(exported)}
        for name, (_, exported) in tiny_llm_exports.items()
    ]
    with ferry_server(models=[], llm_models=models) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(server: FerryProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_chat_is_the_generators(name: str, server, client, tiny_llm_exports) -> None:
    import onnxruntime_genai as og

    exported = tiny_llm_exports[name][1]
    tokenized = httpx.post(
        f"{server.url}/tokenize", json={"model": name, "messages": QUESTION}, timeout=30
    )
    assert tokenized.status_code == 200, tokenized.text
    ids = tokenized.json()["tokens"]
    assert ids == transformers_prompt(tiny_llm_exports[name][0], QUESTION)
    assert len(ids) > 2 * WINDOW  # past the sliding window of the windowed ones
    expected, _ = greedy(og.Model(str(exported)), ids, MAX_TOKENS, eos_ids(exported))
    # The whole decode: random weights write bytes that are not UTF-8 (Qwen2's here), which
    # onnxruntime-genai's own token stream dropped with the text after them.
    text = ChatTokenizer(exported).decode(expected)
    done = client.chat.completions.create(
        model=name,
        messages=QUESTION,
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert done.usage is not None and done.usage.prompt_tokens == len(ids)
    assert done.choices[0].message.content == text
    assert done.usage.completion_tokens == len(expected)


@pytest.mark.parametrize("name", NAMES)
def test_a_forced_tool_call_parses(name: str, client, tiny_llm_exports) -> None:
    """After a call and its result, with the family's own tool template: the prompt is the one
    transformers renders, and the forced call comes back as a call the client parses."""
    done = client.chat.completions.create(
        model=name,
        messages=HISTORY,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,
        # A random model spells the call in short tokens, a character or two each.
        max_tokens=200,
    )
    assert done.usage is not None
    # Parsed arguments and no null content: what transformers' templates are written for.
    messages = [{**m, "content": ""} if "tool_calls" in m else m for m in HISTORY]
    messages[-2]["tool_calls"] = [TEMPLATE_CALL]
    expected = transformers_prompt(tiny_llm_exports[name][0], messages, TOOLS)
    assert done.usage.prompt_tokens == len(expected)
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), TIME_PARAMETERS)


def transformers_prompt(hf: Path, messages: list, tools: list | None = None) -> list[int]:
    """The prompt's ids as transformers' apply_chat_template renders it with the model's own
    tokenizer and template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hf))
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False).input_ids


@pytest.mark.parametrize("name", NAMES)
def test_a_json_schema_answer_validates(name: str, client) -> None:
    done = client.chat.completions.create(
        model=name,
        messages=QUESTION,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "rain", "schema": RAIN_SCHEMA, "strict": True},
        },
        max_tokens=64,
    )
    choice = done.choices[0]
    assert choice.finish_reason == "stop", choice
    assert choice.message.content is not None
    jsonschema.validate(json.loads(choice.message.content), RAIN_SCHEMA)
