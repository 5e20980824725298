"""litellm's completion() and responses() to an OpenAI-compatible server, as its users call it
(`openai/<model>` with api_base)."""

from __future__ import annotations

import json

import litellm

from tests.clients.frameworks.shapes import (
    MAX_TOKENS,
    MODEL,
    PERSON_PROMPT,
    WEATHER_PROMPT,
    Answer,
    Call,
    Person,
    Usage,
    Weather,
)

# The red "Provider List" hint it prints for a model its table does not know.
litellm.suppress_debug_info = True

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": Weather.model_json_schema(),
    },
}


def request(url: str, prompt: str, **extra) -> dict:
    return {
        "model": f"openai/{MODEL}",
        "api_base": f"{url}/v1",
        "api_key": "unused",
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        **extra,
    }


def calls(message) -> list[Call]:
    return [
        Call(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []
    ]


def usage(reported) -> Usage:
    return Usage(reported.prompt_tokens, reported.completion_tokens)


def structured(url: str) -> Answer:
    """litellm turns the pydantic model into a json_schema format; its message is the JSON."""
    response = litellm.completion(**request(url, PERSON_PROMPT, response_format=Person))
    content = response.choices[0].message.content
    return Answer(output=Person.model_validate_json(content), usage=usage(response.usage))


def structured_responses(url: str) -> Answer:
    response = litellm.responses(
        model=f"openai/{MODEL}",
        api_base=f"{url}/v1",
        api_key="unused",
        input=PERSON_PROMPT,
        text_format=Person,
        temperature=0,
        max_output_tokens=MAX_TOKENS,
    )
    (message,) = response.output
    (text,) = message.content
    return Answer(output=Person.model_validate_json(text.text))


def forced(url: str) -> Answer:
    tools = {"tools": [WEATHER_TOOL], "tool_choice": "required"}
    response = litellm.completion(**request(url, WEATHER_PROMPT, **tools))
    return Answer(calls(response.choices[0].message), usage=usage(response.usage))


def streamed(url: str) -> Answer:
    """stream_chunk_builder reassembles the calls and takes the usage chunk's counts (with no
    usage chunk, litellm counts tokens itself: the test compares them with the server's)."""
    extra = {"stream": True, "stream_options": {"include_usage": True}}
    tools = {"tools": [WEATHER_TOOL], "tool_choice": "required"}
    chunks = list(litellm.completion(**request(url, WEATHER_PROMPT, **tools, **extra)))
    whole = litellm.stream_chunk_builder(chunks)
    return Answer(calls(whole.choices[0].message), usage=usage(whole.usage))


def beside_format(url: str) -> Answer:
    tools = {"tools": [WEATHER_TOOL], "tool_choice": "required", "response_format": Person}
    response = litellm.completion(**request(url, WEATHER_PROMPT, **tools))
    return Answer(calls(response.choices[0].message))
