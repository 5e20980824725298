"""langchain's ChatOpenAI (chat completions or the Responses API) and a langgraph agent from
create_agent with ProviderStrategy: a tool and the output's format in each request."""

from __future__ import annotations

from langchain.agents import create_agent
from langchain.agents.middleware import wrap_model_call
from langchain.agents.structured_output import ProviderStrategy
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from tests.clients.frameworks import shapes


def chat_model(url: str, api: str) -> ChatOpenAI:
    return ChatOpenAI(
        model=shapes.MODEL,
        base_url=f"{url}/v1",
        api_key="unused",
        temperature=0,
        max_tokens=shapes.MAX_TOKENS,
        max_retries=0,
        stream_usage=True,
        use_responses_api=api == "responses",
    )


def usage(message) -> shapes.Usage:
    used = message.usage_metadata
    return shapes.Usage(used["input_tokens"], used["output_tokens"])


def structured(url: str, api: str) -> shapes.Answer:
    model = chat_model(url, api).with_structured_output(
        shapes.Person, method="json_schema", include_raw=True
    )
    result = model.invoke(shapes.PERSON_PROMPT)
    return shapes.Answer(output=result["parsed"], usage=usage(result["raw"]))


def streamed(url: str) -> shapes.Answer:
    """bind_tools forcing the tool, streamed: the chunks add up to the call and the usage.
    langchain leaves a tool's schema open (no `additionalProperties: false`) unless strict."""
    get_weather, _ = shapes.weather_tool()
    model = chat_model(url, "chat").bind_tools(
        [tool(get_weather, args_schema=shapes.Weather)], tool_choice="get_weather", strict=True
    )
    whole = None
    for chunk in model.stream(shapes.WEATHER_PROMPT):
        whole = chunk if whole is None else whole + chunk
    calls = [shapes.Call(c["name"], c["args"]) for c in whole.tool_calls]
    return shapes.Answer(calls, usage=usage(whole))


@wrap_model_call
def tool_then_format(request, handler):
    """The tool forced on the first step, refused once it answered: the run ends in the format
    whatever the model prefers. ProviderStrategy binds the tools with model_settings (not the
    request's tool_choice), and marks them strict on chat completions only."""
    called = any(isinstance(m, ToolMessage) for m in request.messages)
    choice = "none" if called else "get_weather"
    settings = {**request.model_settings, "tool_choice": choice, "strict": True}
    return handler(request.override(model_settings=settings))


def beside_format(url: str, api: str) -> shapes.Answer:
    get_weather, calls = shapes.weather_tool()
    agent = create_agent(
        chat_model(url, api),
        tools=[tool(get_weather, args_schema=shapes.Weather)],
        response_format=ProviderStrategy(shapes.Person),
        middleware=[tool_then_format],
    )
    state = agent.invoke({"messages": [{"role": "user", "content": shapes.WEATHER_PROMPT}]})
    return shapes.Answer(calls, state["structured_response"])
