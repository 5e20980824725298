"""pydantic-ai agents on its OpenAI chat and Responses models: the output type as a forced tool
(its default), as a native json_schema format, streamed, and a function tool beside it."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
from pydantic_ai import Agent, NativeOutput, RunContext
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RunUsage

from tests.clients.frameworks import shapes

SETTINGS = ModelSettings(temperature=0, max_tokens=shapes.MAX_TOKENS)
MODELS = {"chat": OpenAIChatModel, "responses": OpenAIResponsesModel}


def model(url: str, api: str) -> OpenAIChatModel | OpenAIResponsesModel:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    return MODELS[api](shapes.MODEL, provider=OpenAIProvider(openai_client=client))


def usage(run: RunUsage) -> shapes.Usage:
    return shapes.Usage(run.input_tokens, run.output_tokens)


def structured(url: str, api: str, native: bool) -> shapes.Answer:
    output_type: Any = NativeOutput(shapes.Person) if native else shapes.Person
    agent = Agent(model(url, api), output_type=output_type, model_settings=SETTINGS)
    result = agent.run_sync(shapes.PERSON_PROMPT)
    return shapes.Answer(output=result.output, usage=usage(result.usage))


def streamed(url: str) -> shapes.Answer:
    """The output tool's call, streamed (pydantic-ai asks for the usage chunk)."""

    async def run() -> shapes.Answer:
        agent = Agent(model(url, "chat"), output_type=shapes.Person, model_settings=SETTINGS)
        async with agent.run_stream(shapes.PERSON_PROMPT) as stream:
            person = await stream.get_output()
            call = shapes.Call("final_result", person.model_dump(mode="json"))
            return shapes.Answer([call], person, usage(stream.usage))

    return asyncio.run(run())


def beside_format(url: str) -> shapes.Answer:
    """NativeOutput with a function tool: both go out in each request. The tool is forced on
    the first step and refused on the next, so the run ends in the format whatever the model
    prefers (pydantic-ai takes a per-step tool_choice only from a callable)."""
    get_weather, calls = shapes.weather_tool()

    def settings(context: RunContext[None]) -> ModelSettings:
        return {**SETTINGS, "tool_choice": "required" if context.run_step == 1 else "none"}

    agent = Agent(
        model(url, "chat"),
        output_type=NativeOutput(shapes.Person),
        tools=[get_weather],
        model_settings=settings,
    )
    result = agent.run_sync(shapes.WEATHER_PROMPT)
    return shapes.Answer(calls, result.output)
