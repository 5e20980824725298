"""The openai SDK for Node and the Vercel AI SDK against the real server on the default chat
model: node/clients.mjs runs one check and prints what the SDK parsed and the keys of what it
sent; the packages are node/package-lock.json's, installed with `npm ci` when missing or stale."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.clients.frameworks.shapes import Person, Weather

pytestmark = pytest.mark.integration

NODE = Path(__file__).parent / "node"


@pytest.fixture(scope="module")
def node_clients() -> Path:
    installed = NODE / "node_modules" / ".package-lock.json"
    lock = NODE / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE, check=True, timeout=300)
    return NODE


def run(node_clients: Path, check: str, url: str) -> dict[str, Any]:
    done = subprocess.run(
        ["node", "clients.mjs", check, url],
        cwd=node_clients,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("check", ["openai-parse", "ai-object-chat", "ai-object-responses"])
def test_structured_output_parses(node_clients, llm_server, check):
    """The SDK parses the json_schema answer (chat) or text format (Responses) into an object."""
    answer = run(node_clients, check, llm_server.url)
    assert isinstance(answer["output"], dict)
    Person.model_validate(answer["output"])
    (keys,) = answer["sent"]
    assert "response_format" in keys or "text" in keys


@pytest.mark.parametrize("check", ["openai-stream-tool", "ai-stream-tool"])
def test_a_streamed_tool_call_reports_usage(node_clients, llm_server, check):
    """A forced call streamed with the usage chunk: the SDK reassembles the call and reports
    the usage (without the chunk, neither has any to report)."""
    answer = run(node_clients, check, llm_server.url)
    (keys,) = answer["sent"]
    assert {"tools", "tool_choice", "stream", "stream_options"} <= set(keys)
    (call,) = answer["calls"]
    assert call["name"] == "get_weather"
    Weather.model_validate(call["arguments"])
    prompt_tokens, completion_tokens = answer["usage"]
    assert prompt_tokens > 0 and completion_tokens > 0


def test_a_tool_beside_an_output_format(node_clients, llm_server):
    """generateText with a tool and an output object sends both in one request."""
    answer = run(node_clients, "ai-tool-beside-format", llm_server.url)
    (keys,) = answer["sent"]
    assert {"tools", "response_format"} <= set(keys)
    (call,) = answer["calls"]
    assert call["name"] == "get_weather"
    Weather.model_validate(call["arguments"])
