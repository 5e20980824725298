"""Nothing one client sends can break Ferry for the others: a real server, hostile inputs.

Each probe is followed by the check that matters to everyone else: /metrics still answers and
parses with a bounded series count, and a normal /predict still returns the reference embedding.
"""

from __future__ import annotations

import json
import random
import string

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from ferry.bench.api_servers import process_roles
from ferry.bench.rss_by_request import rss_mib
from ferry.bench.server_process import DEFAULT_MODEL, TINY_LLM, default_model_config, ferry_server
from tests.server.conftest import API_SERVERS
from tests.support.llm_configs import tiny_llm_config

pytestmark = pytest.mark.integration

REFERENCE_IDS = [101, 7592, 2088, 102]
POST_ROUTES = (
    "/predict",
    "/v1/embeddings",
    "/v1/chat/completions",
    "/v1/completions",
    f"/v2/models/{DEFAULT_MODEL}/infer",
)


@pytest.fixture(scope="module", params=API_SERVERS)
def server(request):
    with ferry_server(
        [default_model_config()],
        llm_models=[tiny_llm_config(max_running=2, max_waiting=8)],
        server={"api_servers": request.param},
    ) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def reference(client) -> np.ndarray:
    answer = client.post("/predict", json={"input_ids": REFERENCE_IDS})
    assert answer.status_code == 200
    return np.asarray(answer.json()["outputs"][0]["sentence_embedding"])


def post_raw(client: httpx.Client, path: str, body: bytes) -> httpx.Response:
    return client.post(path, content=body, headers={"content-type": "application/json"})


def series(client: httpx.Client) -> int:
    answer = client.get("/metrics")
    assert answer.status_code == 200
    families = list(text_string_to_metric_families(answer.text))  # raises if unparseable
    return sum(len(f.samples) for f in families)


def assert_others_unharmed(client: httpx.Client, reference: np.ndarray) -> None:
    answer = client.post("/predict", json={"input_ids": REFERENCE_IDS})
    assert answer.status_code == 200
    got = np.asarray(answer.json()["outputs"][0]["sentence_embedding"])
    np.testing.assert_allclose(got, reference, atol=1e-6)
    assert client.get("/health/ready").status_code == 200


def send_named(client: httpx.Client, names: list[str]) -> None:
    for index, name in enumerate(names):
        path = POST_ROUTES[index % 4]
        field = {"/predict": "inputs", "/v1/embeddings": "input"}.get(path, "prompt")
        value = '"hi"'
        if "chat" in path:
            field, value = "messages", '[{"role": "user", "content": "hi"}]'
        body = f'{{"model": {name}, "{field}": {value}}}'.encode()
        answer = post_raw(client, path, body)
        assert 400 <= answer.status_code < 500, (path, answer.status_code, answer.text[:200])


def test_metrics_survive_any_model_name(client, reference):
    rng = random.Random(0)

    def random_names(count: int) -> list[str]:
        return [json.dumps("".join(rng.choices(string.printable, k=12))) for _ in range(count)]

    hostile = ['"\\ud800"', '"a\\u0000b"', json.dumps("x" * 2 * 2**20)]
    send_named(client, hostile + random_names(100))
    series(client)  # a scrape counts itself after answering: the first one adds its own series
    settled = series(client)
    # Every route and status has been seen: a new name must add no series at all.
    send_named(client, random_names(200))
    assert series(client) == settled
    text = client.get("/metrics").text
    assert "\\ud800" not in text and "xxxxxxxx" not in text
    assert_others_unharmed(client, reference)


BAD_INPUTS = [
    ("/predict", {"input_ids": [101, 2**63, 102]}, "input_ids"),
    ("/predict", {"input_ids": [[101, 102], [101, 2**64 + 5]]}, "input_ids[1]"),
    ("/predict", {"input_ids": [101, 102], "attention_mask": [1, 2**63]}, "attention_mask"),
    ("/v1/embeddings", {"model": DEFAULT_MODEL, "input": [101, 2**63]}, "input"),
    # The hot routes' JSON parser refuses lone surrogates outright; the answer names where.
    ("/predict", {"inputs": "\ud800 lone"}, "inputs"),
    ("/predict", {"inputs": ["fine", "\udfff"]}, "inputs[1]"),
    ("/v1/embeddings", {"model": DEFAULT_MODEL, "input": "\ud800"}, "input"),
    ("/predict", {"input_ids": []}, "input_ids"),
    # A deadline past on arrival: refused before queueing, never a 504.
    ("/predict", {"input_ids": REFERENCE_IDS, "timeout_ms": 5e-324}, "timeout_ms"),
    ("/predict", {"inputs": []}, "inputs"),
    # A prompt that fills the context (tiny-llm: 2048 tokens) leaves no room to generate.
    ("/v1/completions", {"model": TINY_LLM, "prompt": [5] * 2048}, "prompt"),
    ("/v1/completions", {"model": TINY_LLM, "prompt": [[5], [5] * 2048]}, "prompt[1]"),
    ("/v1/completions", {"model": TINY_LLM, "prompt": ["", "x"]}, "prompt"),
    (
        "/v1/chat/completions",
        {"model": TINY_LLM, "messages": [{"role": "user", "content": "\ud800"}]},
        "messages[0]",
    ),
    ("/v1/completions", {"model": TINY_LLM, "prompt": "x", "stop": ["s"] * 1000}, "stop"),
    ("/v1/completions", {"model": TINY_LLM, "prompt": ["x"] * 5000}, "prompt"),
    # More generations than the engine holds (2 running + 8 waiting): a 400, never a 429.
    ("/v1/completions", {"model": TINY_LLM, "prompt": ["a"] * 256, "n": 8}, "prompt"),
    ("/v1/completions", {"model": TINY_LLM, "prompt": ["a", "b"], "n": 8}, "n"),
    ("/predict", {"inputs": "word " * 30_000}, "inputs"),
    # Issue 48: echoed prompts' log probabilities are bounded (8 x 2,000 tokens x 21).
    (
        "/v1/completions",
        {"model": TINY_LLM, "prompt": [[5] * 2000] * 8, "echo": True, "logprobs": 20},
        "logprobs",
    ),
    (
        "/predict",
        {"input_ids": [[101] * 256] * 256, "outputs": ["last_hidden_state"]},
        "outputs",
    ),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD_INPUTS)
def test_bad_input_gets_a_4xx_naming_the_field(client, reference, path, body, param):
    # Lone surrogates cannot be sent through httpx's json=: written as JSON escapes by hand.
    answer = post_raw(client, path, json.dumps(body).encode())
    assert 400 <= answer.status_code < 500, answer.text[:300]
    error = answer.json()["error"]
    assert (error["param"] or "").startswith(param), error


DEEP = b"[" * 10_000 + b"]" * 10_000
BAD_BODIES = [
    ("/predict", b'{"inputs": ' + DEEP + b"}", "inputs[0]"),
    ("/v1/embeddings", b'{"model": "m", "input": ' + DEEP + b"}", "input[0]"),
    ("/v1/chat/completions", b'{"model": "m", "messages": ' + DEEP + b"}", "messages[0]"),
    ("/v1/completions", b'{"prompt": ' + DEEP + b', "model": "m"}', "prompt[0]"),
    ("/v1/completions", b'{"model": "m", "prompt": ["a", "b",]}', "prompt[2]"),
    (f"/v2/models/{DEFAULT_MODEL}/infer", b'{"inputs": [{"name": "\\ud800"}]}', "inputs[0]"),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD_BODIES)
def test_bodies_that_are_not_json_name_the_field_they_break_in(client, path, body, param):
    answer = post_raw(client, path, body)
    assert 400 <= answer.status_code < 500, answer.text[:300]
    error = answer.json()["error"]
    if path.startswith("/v2/"):  # KServe's shape: the field leads the message
        assert error.startswith(f"{param}: request is not valid JSON"), error
    else:
        assert error["param"] == param and "Invalid JSON" in error["message"], error


@pytest.mark.parametrize("path", POST_ROUTES)
def test_megabytes_of_newlines_are_refused_saying_where(client, reference, path):
    """Issue 48: 4 MB of newlines is parsed and refused off the event loop (its line found by
    counting blocks of the body, not newline by newline)."""
    answer = post_raw(client, path, b"\n" * (4 * 2**20 - 1024))
    assert 400 <= answer.status_code < 500, answer.text[:300]
    assert "JSON" in answer.text and "line" in answer.text, answer.text[:300]
    assert_others_unharmed(client, reference)


NAMED_BODIES = {
    "/predict": {"inputs": "x"},
    "/v1/embeddings": {"input": "x"},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "x"}]},
    "/v1/completions": {"prompt": "x"},
}


@pytest.mark.parametrize("path", [*NAMED_BODIES, "/v1/models/{name}", "/v2/models/{name}/infer"])
def test_an_unknown_model_is_a_404_naming_model_with_a_bounded_echo(client, path):
    name = "m" * 3000
    if "{name}" in path:
        method = "GET" if path.startswith("/v1/") else "POST"
        answer = client.request(method, path.format(name=name), json={"inputs": []})
    else:
        answer = client.post(path, json={"model": name, **NAMED_BODIES[path]})
    assert answer.status_code == 404, answer.text[:300]
    assert len(answer.content) < 1000  # the name is cut, not echoed whole
    assert "m" * 256 in answer.text and "(3000 characters)" in answer.text
    error = answer.json()["error"]
    if path.startswith("/v2/"):  # Triton's words, which its clients match
        assert error.startswith("Request for unknown model: 'mmm")
    else:
        assert error["param"] == "model", error


KSERVE_INFER = f"/v2/models/{DEFAULT_MODEL}/infer"
KSERVE_IDS = {"name": "input_ids", "shape": [1, 4], "datatype": "INT64", "data": REFERENCE_IDS}
# A request at `priority` on every protocol that takes one (gRPC: tests/server/kserve).
PRIORITY_BODIES = {
    "/predict": lambda p: {"input_ids": REFERENCE_IDS, "priority": p},
    "/v1/embeddings": lambda p: {"model": DEFAULT_MODEL, "input": REFERENCE_IDS, "priority": p},
    "/v1/chat/completions": lambda p: {
        "model": TINY_LLM,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "priority": p,
    },
    "/v1/completions": lambda p: {
        "model": TINY_LLM,
        "prompt": "hi",
        "max_tokens": 1,
        "priority": p,
    },
    KSERVE_INFER: lambda p: {"inputs": [KSERVE_IDS], "parameters": {"priority": p}},
}


def refused_param(answer: httpx.Response, path: str) -> str:
    error = answer.json()["error"]
    return error.split(":")[0] if path.startswith("/v2/") else error["param"]


@pytest.mark.parametrize("path", PRIORITY_BODIES)
@pytest.mark.parametrize("priority", ["1", 1.5, True, None, 2**31, -(2**31) - 1])
def test_a_priority_not_a_32_bit_integer_is_refused_naming_it(client, path, priority):
    answer = client.post(path, json=PRIORITY_BODIES[path](priority))
    assert answer.status_code == (422 if path == "/predict" else 400), answer.text[:300]
    assert refused_param(answer, path) == "priority"


@pytest.mark.parametrize("path", PRIORITY_BODIES)
def test_an_integer_priority_is_served(client, path):
    for priority in (0, 2**31 - 1):
        answer = client.post(path, json=PRIORITY_BODIES[path](priority))
        assert answer.status_code == 200, answer.text[:300]


@pytest.mark.parametrize("path", PRIORITY_BODIES)
def test_without_a_key_no_priority_is_more_urgent_than_the_default(client, path):
    """Priority is a privilege (server/tenancy.py): a keyless -10 is a 403 naming it, before
    any work."""
    answer = client.post(path, json=PRIORITY_BODIES[path](-10))
    assert answer.status_code == 403, answer.text[:300]
    assert refused_param(answer, path) == "priority"


def test_kserve_bad_input_gets_a_4xx(client, reference):
    path = KSERVE_INFER
    huge = {
        "inputs": [
            {"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [101, 2**70]}
        ]
    }
    deep = b"[" * 10_000 + b"]" * 10_000
    not_objects = {"inputs": [], "outputs": [None]}  # found by the fuzzer below: was a 500
    outputs = {
        "inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [101, 102]}],
        "outputs": 5,
    }
    for body in (
        json.dumps(huge).encode(),
        deep,
        json.dumps(outputs).encode(),
        json.dumps(not_objects).encode(),
    ):
        answer = post_raw(client, path, body)
        assert 400 <= answer.status_code < 500, answer.text[:300]
        assert isinstance(answer.json()["error"], str)  # KServe's error shape
    # Python's int conversion never leaks into a message.
    answer = post_raw(client, path, json.dumps(huge).encode())
    assert answer.json()["error"].startswith("input_ids[1]: 1180591620717411303424 is outside")
    headers = {"content-type": "application/json", "inference-header-content-length": "abc"}
    answer = client.post(path, content=json.dumps(outputs).encode(), headers=headers)
    assert answer.status_code == 400
    assert answer.json()["error"].startswith("Inference-Header-Content-Length: must be the byte")
    assert_others_unharmed(client, reference)


def test_a_deadline_the_model_cannot_meet_is_refused_before_queueing(client, reference):
    # 1 ms for a 256-token row: MiniLM needs several times that on any CPU.
    ids = [101] + [7592] * 254 + [102]
    answer = client.post("/predict", json={"input_ids": ids, "timeout_ms": 1})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["param"] == "timeout_ms" and "cannot be met" in error["message"], error
    # A deadline it can meet is served.
    answer = client.post("/predict", json={"input_ids": REFERENCE_IDS, "timeout_ms": 30_000})
    assert answer.status_code == 200
    assert_others_unharmed(client, reference)


def test_repeated_malformed_bodies_leave_no_memory_behind(server, client):
    # docs/guarantees.md: RSS grows with the largest batch run (ONNX Runtime's arena), never
    # with refused requests. After one round to settle allocator pools, more rounds add nothing.
    bodies = [
        b'{"inputs": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
        json.dumps({"model": "x" * 2**20, "inputs": "x"}).encode(),
        json.dumps({"inputs": ["ok", "a " * 1_950_000]}).encode(),
        b'{"inputs": ["\\ud800"]}',
    ]

    def round_of_refusals() -> None:
        for body in bodies * 5:
            assert 400 <= post_raw(client, "/predict", body).status_code < 500

    def rss() -> float:  # the processes that parse and refuse: the API processes, if any
        api = [pid for pid, role in process_roles(server.pid).items() if role == "api"]
        return sum(rss_mib(pid) for pid in api or [server.pid])

    round_of_refusals()
    settled = rss()
    for _ in range(4):
        round_of_refusals()
    assert rss() - settled < 16, (settled, rss())


def test_texts_over_the_character_bound_are_refused_before_tokenizing(client, reference):
    # ~3.9 MB: under the body limit, over max_chars_per_text.
    answer = client.post("/predict", json={"inputs": ["ok", "a " * 1_950_000]})
    assert answer.status_code == 422
    assert answer.json()["error"]["param"] == "inputs[1]"
    assert "characters" in answer.json()["error"]["message"]
    # A long text under the bound is tokenized (off the loop) and truncated on request.
    long_text = client.post("/predict", json={"inputs": "word " * 19_000, "truncate": True})
    assert long_text.status_code == 200
    assert long_text.json()["usage"]["prompt_tokens"] == 256
    assert_others_unharmed(client, reference)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False)
    | st.text(alphabet=st.characters(exclude_categories=()), max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "model",
                    "input",
                    "inputs",
                    "input_ids",
                    "attention_mask",
                    "prompt",
                    "messages",
                    "outputs",
                    "stop",
                    "max_tokens",
                    "n",
                    "role",
                    "content",
                    "name",
                    "shape",
                    "datatype",
                    "data",
                    "truncate",
                    "timeout_ms",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=12,
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(route=st.sampled_from(POST_ROUTES), value=JSON_VALUES)
def test_any_json_at_any_route_is_never_a_5xx(client, route, value):
    # ensure_ascii: lone surrogates travel as escapes, as a hostile client would send them.
    answer = post_raw(client, route, json.dumps(value, ensure_ascii=True).encode())
    assert answer.status_code < 500, (route, value, answer.text[:300])


def test_server_healthy_after_fuzzing(client, reference):
    assert_others_unharmed(client, reference)
    assert series(client) < 2000
