"""Chat templates render exactly as transformers' apply_chat_template does, tools included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ferry.llm.chat_tokenizer import ChatTokenizer
from tests.exporters.tiny_llms import MATRIX, TEMPLATES
from tests.llm.llm_paths import HF_DIR

pytestmark = pytest.mark.unit

# Qwen2.5's tools template, shortened: each tool and each call's arguments through `tojson`.
QWEN25_TOOLS = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
    {%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>assistant' }}
        {%- for tool_call in message.tool_calls %}
            {%- set tool_call = tool_call.function %}
            {{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
# What else transformers' environment has: tojson's options, loop controls, the generation tag,
# namespaces, dict(), and `tools`/`documents` defined (None) when not given.
EXTRAS = """\
{%- set ns = namespace(count=0, seen=dict(first=true)) %}
{%- for message in messages %}
    {%- if loop.index > 2 %}{% break %}{% endif %}
    {%- set ns.count = ns.count + 1 %}
    {%- generation %}{{ message.role }}={{ message | tojson(indent=2, sort_keys=true) }}
    {%- endgeneration %}
{%- endfor %}
{{- ns.count }}|{{ tools is defined }}|{{ documents is none }}|{{ eos_token }}|{{ pad_token }}
{{- tools | tojson(separators=(',', ':')) }}
"""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "compare",
            "description": "Is a < b && b > c? Gives «oui» or 'non' — naïvely, 東京 time",
            "parameters": {
                "type": "object",
                "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
                "required": ["b", "a"],
            },
        },
    }
]
MESSAGES = [
    {"role": "user", "content": "Is 1 < 2 & 3 > 2? Réponds."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "compare", "arguments": {"z": "<&>", "a": 1}}}
        ],
    },
    {"role": "user", "content": "thanks"},
]
SPECIALS = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
# The architecture matrix's templates, one of each family's tool format (tests/exporters).
FAMILY_TEMPLATES = sorted({spec.template for spec in MATRIX.values()})
# Nested parameters: an object in an object, an array of enums, a description with < & and accents.
NESTED_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather at a place <city & country>, «précis»",
            "parameters": {
                "type": "object",
                "properties": {
                    "place": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "description": "e.g. Zürich"},
                            "country": {"type": "string", "maxLength": 2},
                        },
                        "required": ["city"],
                    },
                    "units": {"type": "array", "items": {"enum": ["celsius", "fahrenheit"]}},
                },
                "required": ["place"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
# A system message, an assistant's tool call (arguments parsed, as Ferry hands them over) and
# its result: what an agent loop sends on its second call.
TOOL_CONVERSATION = [
    {"role": "system", "content": "You are terse. Use <tools> & nothing else."},
    {"role": "user", "content": "Weather in Zürich?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call12345",
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": {
                        "place": {"city": "Zürich", "country": "CH"},
                        "units": ["celsius"],
                    },
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call12345", "content": '{"temp": 3, "sky": "<grey>"}'},
]


@pytest.fixture(params=[QWEN25_TOOLS, EXTRAS], ids=["qwen2.5-tools", "extras"])
def template(request) -> str:
    return request.param


def ferry_tokenizer(folder: Path, template: str) -> ChatTokenizer:
    (folder / "tokenizer.json").write_text((HF_DIR / "tokenizer.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(SPECIALS))
    (folder / "chat_template.jinja").write_text(template)
    return ChatTokenizer(folder)


def transformers_render(template: str, messages: list, tools: list | None) -> str:
    from transformers import PreTrainedTokenizerFast

    reference = PreTrainedTokenizerFast(
        tokenizer_file=str(HF_DIR / "tokenizer.json"), chat_template=template, **SPECIALS
    )
    return reference.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )


@pytest.mark.parametrize("tools", [TOOLS, None], ids=["tools", "no-tools"])
def test_renders_as_transformers_apply_chat_template(
    tmp_path: Path, template: str, tools: list | None
) -> None:
    expected = transformers_render(template, MESSAGES, tools)
    assert ferry_tokenizer(tmp_path, template).render_chat(MESSAGES, tools) == expected
    if tools is not None and template is QWEN25_TOOLS:  # the test sees what it is about
        assert "a < b && b > c" in expected and "東京" in expected
        assert expected.index('"type": "function"') < expected.index('"function"')


@pytest.mark.parametrize("name", FAMILY_TEMPLATES)
@pytest.mark.parametrize("tools", [NESTED_TOOLS, None], ids=["tools", "no-tools"])
def test_each_familys_tool_template_renders_as_transformers(
    tmp_path: Path, name: str, tools: list | None
) -> None:
    template = (TEMPLATES / name).read_text()
    expected = transformers_render(template, TOOL_CONVERSATION, tools)
    assert ferry_tokenizer(tmp_path, template).render_chat(TOOL_CONVERSATION, tools) == expected
    # The test sees what it is about: the call, its result, and the nested tool when given.
    assert "Zürich" in expected and "<grey>" in expected
    assert ("fahrenheit" in expected) == (tools is not None)


def test_underscore_names_are_refused_on_namespaces(tmp_path: Path) -> None:
    import jinja2

    chat = ferry_tokenizer(tmp_path, "{% set ns = namespace(_x=1) %}{{ ns._x }}")
    with pytest.raises(jinja2.exceptions.SecurityError, match="underscore"):
        chat.render_chat(MESSAGES)
