"""dspy through its litellm engine: a typed output field (JSONAdapter sends it as a json_schema
format) and native tool calls (ChatAdapter: tools alone; JSONAdapter: tools beside the format).

dspy sends a json_schema format and native tools only to models its catalog (litellm's) says
support them: the model is registered there, as a user of a self-hosted server does."""

from __future__ import annotations

import dspy
import litellm

from tests.clients.frameworks import shapes

litellm.suppress_debug_info = True
litellm.register_model(
    {
        f"openai/{shapes.MODEL}": {
            "litellm_provider": "openai",
            "mode": "chat",
            "supports_function_calling": True,
            "supports_tool_choice": True,
            "supports_response_schema": True,
        }
    }
)


class Extract(dspy.Signature):
    """Extract the person."""

    text: str = dspy.InputField()
    person: shapes.Person = dspy.OutputField()


class Ask(dspy.Signature):
    """Answer the question with the tools."""

    question: str = dspy.InputField()
    tools: list[dspy.Tool] = dspy.InputField()
    outputs: dspy.ToolCalls = dspy.OutputField()


def lm(url: str) -> dspy.LM:
    return dspy.LM(
        f"openai/{shapes.MODEL}",
        api_base=f"{url}/v1",
        api_key="unused",
        engine="litellm",
        cache=False,
        num_retries=0,
        temperature=0,
        max_tokens=shapes.MAX_TOKENS,
    )


def usage(model: dspy.LM) -> shapes.Usage:
    used = model.history[-1]["usage"]
    return shapes.Usage(used["prompt_tokens"], used["completion_tokens"])


def structured(url: str) -> shapes.Answer:
    model = lm(url)
    with dspy.context(lm=model, adapter=dspy.JSONAdapter()):
        prediction = dspy.Predict(Extract)(text=shapes.PERSON_PROMPT)
    return shapes.Answer(output=prediction.person, usage=usage(model))


def tool_calls(url: str, adapter: dspy.Adapter) -> shapes.Answer:
    get_weather, _ = shapes.weather_tool()
    with dspy.context(lm=lm(url), adapter=adapter):
        prediction = dspy.Predict(Ask)(
            question=shapes.WEATHER_PROMPT,
            tools=[dspy.Tool(get_weather)],
            config={"tool_choice": "required"},
        )
    return shapes.Answer([shapes.Call(c.name, c.args) for c in prediction.outputs.tool_calls])


def forced(url: str) -> shapes.Answer:
    return tool_calls(url, dspy.ChatAdapter(use_native_function_calling=True))


def beside_format(url: str) -> shapes.Answer:
    return tool_calls(url, dspy.JSONAdapter(use_native_function_calling=True))
