"""litellm's completion() and responses() to an OpenAI-compatible server, as its users call it
(`openai/<model>` with api_base)."""

from __future__ import annotations

import json

import litellm

from tests.clients.frameworks import shapes

# The red "Provider List" hint it prints for a model its table does not know.
litellm.suppress_debug_info = True

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": shapes.Weather.model_json_schema(),
    },
}


def request(url: str, prompt: str, **extra) -> dict:
    return {
        "model": f"openai/{shapes.MODEL}",
        "api_base": f"{url}/v1",
        "api_key": "unused",
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": shapes.MAX_TOKENS,
        **extra,
    }


def calls(message) -> list[shapes.Call]:
    return [
        shapes.Call(c.function.name, json.loads(c.function.arguments))
        for c in message.tool_calls or []
    ]


def usage(reported) -> shapes.Usage:
    return shapes.Usage(reported.prompt_tokens, reported.completion_tokens)


def structured(url: str) -> shapes.Answer:
    """litellm turns the pydantic model into a json_schema format; its message is the JSON."""
    response = litellm.completion(
        **request(url, shapes.PERSON_PROMPT, response_format=shapes.Person)
    )
    content = response.choices[0].message.content
    return shapes.Answer(
        output=shapes.Person.model_validate_json(content), usage=usage(response.usage)
    )


def structured_responses(url: str) -> shapes.Answer:
    response = litellm.responses(
        model=f"openai/{shapes.MODEL}",
        api_base=f"{url}/v1",
        api_key="unused",
        input=shapes.PERSON_PROMPT,
        text_format=shapes.Person,
        temperature=0,
        max_output_tokens=shapes.MAX_TOKENS,
    )
    (message,) = response.output
    (text,) = message.content
    return shapes.Answer(output=shapes.Person.model_validate_json(text.text))


def forced(url: str) -> shapes.Answer:
    tools = {"tools": [WEATHER_TOOL], "tool_choice": "required"}
    response = litellm.completion(**request(url, shapes.WEATHER_PROMPT, **tools))
    return shapes.Answer(calls(response.choices[0].message), usage=usage(response.usage))


def streamed(url: str) -> shapes.Answer:
    """stream_chunk_builder reassembles the calls and takes the usage chunk's counts (with no
    usage chunk, litellm counts tokens itself: the test compares them with the server's)."""
    extra = {"stream": True, "stream_options": {"include_usage": True}}
    tools = {"tools": [WEATHER_TOOL], "tool_choice": "required"}
    chunks = list(litellm.completion(**request(url, shapes.WEATHER_PROMPT, **tools, **extra)))
    whole = litellm.stream_chunk_builder(chunks)
    return shapes.Answer(calls(whole.choices[0].message), usage=usage(whole.usage))


def beside_format(url: str) -> shapes.Answer:
    tools = {"tools": [WEATHER_TOOL], "tool_choice": "required", "response_format": shapes.Person}
    response = litellm.completion(**request(url, shapes.WEATHER_PROMPT, **tools))
    return shapes.Answer(calls(response.choices[0].message))
