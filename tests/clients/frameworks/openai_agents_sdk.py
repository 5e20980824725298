"""The OpenAI Agents SDK on its chat-completions and Responses models: an output_type alone,
a tool beside an output_type (both sent in one request), and a streamed run."""

from __future__ import annotations

import asyncio

import openai
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
)

from tests.clients.frameworks import shapes

MODELS = {"chat": OpenAIChatCompletionsModel, "responses": OpenAIResponsesModel}
# Tracing would export each run to OpenAI's servers.
OFFLINE = RunConfig(tracing_disabled=True)


def agent(url: str, api: str, settings: ModelSettings | None = None, **options) -> Agent:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    defaults = ModelSettings(temperature=0, max_tokens=shapes.MAX_TOKENS)
    return Agent(
        name="ferry",
        model=MODELS[api](model=shapes.MODEL, openai_client=client),
        output_type=shapes.Person,
        model_settings=defaults.resolve(settings),
        **options,
    )


def usage(result) -> shapes.Usage:
    used = result.context_wrapper.usage
    return shapes.Usage(used.input_tokens, used.output_tokens)


def structured(url: str, api: str) -> shapes.Answer:
    result = Runner.run_sync(agent(url, api), shapes.PERSON_PROMPT, run_config=OFFLINE)
    return shapes.Answer(output=result.final_output, usage=usage(result))


def tool_agent(url: str, api: str, **settings) -> tuple[Agent, list[shapes.Call]]:
    """The tool forced, and its result the run's end: one request carrying the tool and the
    output_type's format."""
    get_weather, calls = shapes.weather_tool()
    return agent(
        url,
        api,
        tools=[function_tool(get_weather)],
        tool_use_behavior="stop_on_first_tool",
        settings=ModelSettings(tool_choice="required", **settings),
    ), calls


def beside_format(url: str, api: str) -> shapes.Answer:
    tooled, calls = tool_agent(url, api)
    Runner.run_sync(
        tooled, shapes.WEATHER_PROMPT, run_config=OFFLINE
    )  # ends with the tool's result
    return shapes.Answer(calls)


def streamed(url: str) -> shapes.Answer:
    """On chat completions the SDK asks for the usage chunk only with include_usage."""

    async def run() -> shapes.Answer:
        tooled, calls = tool_agent(url, "chat", include_usage=True)
        result = Runner.run_streamed(tooled, shapes.WEATHER_PROMPT, run_config=OFFLINE)
        async for _ in result.stream_events():
            pass
        return shapes.Answer(calls, usage=usage(result))

    return asyncio.run(run())
