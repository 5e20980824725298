"""Grammars can neither crash nor freeze the server (issue 35): a real server process, its
grammar bounds opened wide so that the hostile grammars reach llguidance itself, in the checker
processes, in one process and behind `api_servers = 2`. Each request is a 400 naming its field,
the server is alive after (its API processes too), and `/health/live` answered within 50 ms
throughout."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest

from ferry.bench.server_process import TINY_LLM, ferry_server
from tests.llm.grammars import chained_defs, gbnf_chain, lark_chain
from tests.server.conftest import API_SERVERS
from tests.support.liveness import LivenessProbe
from tests.support.llm_configs import tiny_llm_config
from tests.support.server_processes import descendants, holds, listening_socket, pids

pytestmark = pytest.mark.integration

OPEN_BOUNDS = {
    "grammar_max_chars": 10**7,
    "grammar_max_rules": 10**6,
    "grammar_max_alternatives": 10**6,
    # Three times the default budget: the 2100-object anyOf below compiles in ~1.5 s alone and
    # took over 10 s with a CPU hog, mutmut and the suite's two workers on 2 cores;
    # gbnf_chain(8000) converts in minutes (2000 rules: 7 s, 4000: 30 s), past it either way.
    "grammar_compile_timeout_s": 30.0,
    "grammar_workers": 1,
}
CRASHES = chained_defs(1000)  # SIGSEGV inside llguidance 1.9
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module", params=API_SERVERS)
def server(request):
    settings = {**OPEN_BOUNDS, "api_servers": request.param}
    with ferry_server(models=[], llm_models=[tiny_llm_config()], server=settings) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        # Warm: the first request's one-time costs are not the hostile grammar's.
        assert post(c, chat(guided_regex="[a-z]{1,3}")).status_code == 200
        yield c


def chat(**fields):
    return (
        "/v1/chat/completions",
        {"model": TINY_LLM, "messages": USER, "max_tokens": 4, **fields},
    )


def post(client: httpx.Client, path_body: tuple[str, dict]) -> httpx.Response:
    path, body = path_body
    return client.post(path, json=body)


def tool(parameters):
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


def response_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


RESPONSES_FORMAT = {"format": {"type": "json_schema", "name": "x", "schema": json.loads(CRASHES)}}


@pytest.mark.parametrize(
    ("path_body", "param", "said"),
    [
        (chat(response_format=response_format(json.loads(CRASHES))),
         "response_format.json_schema.schema", "crashed"),
        (chat(guided_json=CRASHES), "guided_json", "crashed"),
        (chat(tools=tool(json.loads(CRASHES))), "tools[0].function.parameters", "crashed"),
        (("/v1/responses", {"model": TINY_LLM, "input": "hi", "text": RESPONSES_FORMAT}),
         "text.format.schema", "crashed"),
        (chat(guided_grammar=lark_chain(4000)), "guided_grammar", "crashed"),
        # Seconds in the GBNF converter: the compile budget ends it.
        (chat(guided_grammar=gbnf_chain(8000)), "guided_grammar", "grammar_compile_timeout_s"),
    ],
)  # fmt: skip
def test_a_grammar_that_crashes_or_stalls_llguidance_is_a_400_and_nothing_else(
    server, client, path_body, param, said
):
    api_processes = pids(server, "api")
    with LivenessProbe(server.url) as probe:
        answer = post(client, path_body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and said in error["message"]
    probe.assert_lively()
    assert server.process.poll() is None  # the server process itself never died
    assert pids(server, "api") == api_processes  # nor, behind api_servers = 2, an API process
    ok = post(client, chat(guided_regex="[a-z]{1,3}"))
    assert ok.status_code == 200, ok.text


def test_a_grammar_the_engine_stops_mid_way_is_a_400_not_a_500(client):
    """An `anyOf` of 2100 objects compiles, then meets llguidance's 2000-item row limit inside
    onnxruntime-genai once `{"` is written (the default grammar_max_alternatives refuses it)."""
    objects = [
        {"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}
        for i in range(2100)
    ]
    answer = post(client, chat(guided_json={"anyOf": objects}, max_tokens=8))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "guided_json" and "2000" in error["message"]


def many_properties(count: int) -> dict:
    """A valid schema within the default bounds (grammar_max_rules: 1000 subschemas), under
    names never sent before, so that no compile of it is cached anywhere. Compiled by
    onnxruntime-genai inside og.Generator's creation, GIL held, it froze the loop ~100 ms."""
    tag = uuid.uuid4().hex[:8]
    properties = {f"{tag}{i}": {"type": "integer"} for i in range(count)}
    return {"type": "object", "properties": properties, "required": list(properties)}


def test_an_accepted_large_grammar_does_not_freeze_the_server(server, client):
    """Issue 35's rule for what the engine does with a grammar the checkers accepted."""
    with LivenessProbe(server.url) as probe:
        answer = post(client, chat(guided_json=many_properties(990)))
    assert answer.status_code == 200, answer.text
    probe.assert_lively()


def long_messages(count: int, chars: int) -> list[dict]:
    return [{"role": "user", "content": "word " * (chars // 5)} for _ in range(count)]


def long_tool_call(chars: int) -> list[dict]:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "x" * chars}}
    return [*USER, {"role": "assistant", "content": None, "tool_calls": [call]}]


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param(long_messages(30, 100_000), id="3M characters of messages"),
        pytest.param(long_tool_call(3_000_000), id="3M characters of tool-call arguments"),
        # Within the character bound (2048 tokens x 64 characters), so rendered and tokenized,
        # off the event loop: refused by its token count.
        pytest.param(long_messages(4, 30_000), id="120k characters over the context"),
    ],
)
def test_a_prompt_too_long_is_refused_without_freezing_the_server(server, client, messages):
    """Issue 35's sixth row: inside every documented limit, once a 5.9 s freeze and a 400."""
    with LivenessProbe(server.url) as probe:
        answer = post(client, chat(messages=messages))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "messages"
    probe.assert_lively()


def test_grammar_checker_processes_do_not_hold_the_listening_socket(server, client):
    """A checker holding it would keep the port bound (and accepting into a queue nobody reads)
    after the server is gone. Behind api_servers = 2 the socket an API process received was
    inheritable, and the checkers it started (those replaced after a crash too) kept it."""
    listening = listening_socket(server)
    checkers = [
        pid
        for pid in descendants(server.pid)
        if b"ferry.llm.grammar_worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert checkers
    assert [pid for pid in checkers if holds(pid, listening)] == []
