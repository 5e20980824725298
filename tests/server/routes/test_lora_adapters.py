"""LoRA adapters through a running Ferry: served by name, loaded and unloaded at runtime."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from typing import Any

import httpx
import openai
import pytest

from ferry.bench.server_process import TINY_LLM, ferry_server
from tests.llm.llm_paths import ADAPTERS_DIR, HF_DIR
from tests.server.conftest import API_SERVERS
from tests.support.llm_configs import tiny_llm_config
from tests.support.metrics import metric_value
from tests.support.server_processes import gone, pids, ready, wait_until

pytestmark = pytest.mark.integration

KEY = "lora-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
GUEST = {"Authorization": "Bearer guest-key"}  # a key without adapter_keys' right
REFERENCE = json.loads((ADAPTERS_DIR / "greedy_reference.json").read_text())


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory: pytest.TempPathFactory):
    """A runtime adapter folder holding `shout` and `zen`, and a symlink that leads out of it."""
    root = tmp_path_factory.mktemp("adapters")
    shutil.copytree(ADAPTERS_DIR / "shout", root / "shout")
    shutil.copytree(ADAPTERS_DIR / "zen", root / "zen")
    (root / "escape").symlink_to(ADAPTERS_DIR / "zen")
    return root


@pytest.fixture(scope="module", params=API_SERVERS)
def server(request, adapter_dir):
    llm = tiny_llm_config(
        max_running=4,
        adapters={"zen": str(ADAPTERS_DIR / "zen" / "zen.onnx_adapter")},
        adapter_dir=str(adapter_dir),
        max_adapters=3,
    )
    with ferry_server(
        models=[],
        llm_models=[llm],
        # `api_key` is the tenant "default", the one key allowed to change adapters.
        env={
            "FERRY_API_KEY": KEY,
            "FERRY_API_KEYS": "guest=guest-key",
            "FERRY_ADAPTER_KEYS": "default",
        },
        server={"api_servers": request.param},  # 2: loads and unloads cross to the engine
    ) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


def reference_text(adapter: str, case: int) -> str:
    from ferry.llm.chat_tokenizer import ChatTokenizer

    return ChatTokenizer(HF_DIR).decode(REFERENCE[adapter]["cases"][case]["new_ids"])


def chat(client: openai.OpenAI, model: str, case: int = 0, **kwargs: Any) -> Any:
    messages = REFERENCE["zen"]["cases"][case]["messages"]
    return client.chat.completions.create(
        model=model, messages=messages, max_tokens=20, temperature=0, **kwargs
    )


def post(server, path: str, body: dict[str, Any], headers=AUTH) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=60)


def test_models_lists_the_adapter_with_its_parent(client):
    cards = {m.id: m for m in client.models.list().data}
    assert cards["zen"].parent == TINY_LLM
    assert cards[TINY_LLM].parent is None


def test_adapter_output_equals_the_peft_reference(client, server):
    for case in range(3):
        result = chat(client, "zen", case)
        assert result.model == "zen"
        assert result.choices[0].message.content == reference_text("zen", case)
    streamed = chat(client, "zen", 0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == reference_text("zen", 0)
    # The LLM series carry the adapter's name, so a dashboard can split by it.
    metrics = server.metrics()
    assert metric_value(metrics, "ferry_llm_requests_finished_total", model="zen") >= 4
    lengths = [len(c["new_ids"]) for c in REFERENCE["zen"]["cases"]]
    generated = metric_value(metrics, "ferry_llm_generation_tokens_total", model="zen")
    assert generated == sum(lengths) + lengths[0]


def test_load_and_unload_at_runtime(client, server):
    body = {"lora_name": "shout", "lora_path": "shout/shout.onnx_adapter"}
    assert post(server, "/v1/load_lora_adapter", body, headers={}).status_code == 401
    loaded = post(server, "/v1/load_lora_adapter", body)
    assert loaded.status_code == 200, loaded.text
    assert loaded.text == "Success: LoRA adapter 'shout' added successfully."
    assert chat(client, "shout", 2).choices[0].message.content == reference_text("shout", 2)
    again = post(server, "/v1/load_lora_adapter", body)
    assert again.status_code == 400 and again.json()["error"]["param"] == "lora_name"
    unloaded = post(server, "/v1/unload_lora_adapter", {"lora_name": "shout"})
    assert unloaded.status_code == 200, unloaded.text
    with pytest.raises(openai.NotFoundError):
        chat(client, "shout")
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "shout"}).status_code == 404


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"lora_name": "x", "lora_path": "escape/zen.onnx_adapter"}, "lora_path"),  # symlink out
        ({"lora_name": "x", "lora_path": "../"}, "lora_path"),
        (
            {"lora_name": "x", "lora_path": str(ADAPTERS_DIR / "zen" / "zen.onnx_adapter")},
            "lora_path",
        ),
        ({"lora_name": "x", "lora_path": "shout/missing.onnx_adapter"}, "lora_path"),
        ({"lora_name": TINY_LLM, "lora_path": "shout/shout.onnx_adapter"}, "lora_name"),
        (
            {"lora_name": "x", "lora_path": "shout/shout.onnx_adapter", "load_inplace": True},
            "load_inplace",
        ),
        ({"lora_name": "x y", "lora_path": "shout/shout.onnx_adapter"}, "lora_name"),
        ({"lora_name": "x", "lora_path": "shout/shout.onnx_adapter", "extra": 1}, "extra"),
    ],
)
def test_bad_loads_are_refused_naming_the_field(server, body, param):
    response = post(server, "/v1/load_lora_adapter", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(
    "lora_path",
    [
        "shout/\0.onnx_adapter",  # NUL
        "a/" * 2500,  # 5000 characters
        f"shout/{'a' * 300}.onnx_adapter",  # a 300-character part
        "shout/missing.onnx_adapter",
        "shout/hf",  # there, but no adapter: the engine refuses it
        "shout/hf/adapter_config.json",
    ],
    ids=["nul", "5000 chars", "300-char part", "missing", "a folder", "not an adapter"],
)
def test_every_lora_path_error_is_a_400_without_server_paths(server, adapter_dir, lora_path):
    response = post(server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": lora_path})
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["param"] == "lora_path"
    for server_path in (str(adapter_dir), str(ADAPTERS_DIR), "/tmp/", "/work/"):
        assert server_path not in error["message"], error["message"]


def test_adapter_names_are_bounded_in_length(server):
    body = {"lora_name": "n" * 65, "lora_path": "shout/shout.onnx_adapter"}
    response = post(server, "/v1/load_lora_adapter", body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "lora_name"
    assert "max_adapter_name_chars" in response.json()["error"]["message"]


def test_an_unloaded_adapters_series_leave_metrics(client, server):
    """docs/gpu.md: label values never come from a request. An adapter's name did; once it is
    unloaded, no series carries it."""
    name = "client-chosen-name"
    body = {"lora_name": name, "lora_path": "shout/shout.onnx_adapter"}
    assert post(server, "/v1/load_lora_adapter", body).status_code == 200
    chat(client, name)

    def labelled() -> float:
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        return text.count(f'model="{name}"')

    assert labelled() > 0
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": name}).status_code == 200
    assert labelled() == 0


def test_bad_unloads_are_refused(server):
    base = post(server, "/v1/unload_lora_adapter", {"lora_name": TINY_LLM})
    assert base.status_code == 400 and base.json()["error"]["param"] == "lora_name"
    with_id = post(server, "/v1/unload_lora_adapter", {"lora_name": "zen", "lora_int_id": 1})
    assert with_id.status_code == 400 and with_id.json()["error"]["param"] == "lora_int_id"
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "nope"}).status_code == 404


def test_a_configured_adapter_cannot_be_unloaded_by_a_client(client, server):
    """Issue 48: an adapter of the config file is the operator's; unloaded, no client could
    load it back (its path is outside adapter_dir)."""
    response = post(server, "/v1/unload_lora_adapter", {"lora_name": "zen"})
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["param"] == "lora_name" and "config file" in error["message"]
    assert chat(client, "zen").choices[0].message.content == reference_text("zen", 0)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/load_lora_adapter", {"lora_name": "shout", "lora_path": "shout/shout.onnx_adapter"}),
        ("/v1/unload_lora_adapter", {"lora_name": "zen"}),
        ("/v1/unload_lora_adapter", {"lora_name": "shout"}),
    ],
)
def test_a_key_without_the_adapter_right_changes_no_adapter(client, server, path, body):
    """Issue 48: with keys set, only `adapter_keys` load and unload adapters."""
    response = post(server, path, body, headers=GUEST)
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["param"] == "lora_name" and "adapter_keys" in error["message"]
    assert {m.id for m in client.models.list().data} == {TINY_LLM, "zen"}


# Only API processes have an engine process to restart; a single process ends whole.
@pytest.mark.parametrize("server", [2], indirect=True, ids=["api2"])
def test_an_engine_restart_keeps_the_adapters_loaded_and_unloaded_at_runtime(client, server):
    shout = {"lora_name": "shout", "lora_path": "shout/shout.onnx_adapter"}
    calm = {"lora_name": "calm", "lora_path": "zen/zen.onnx_adapter"}
    assert post(server, "/v1/load_lora_adapter", shout).status_code == 200
    assert post(server, "/v1/load_lora_adapter", calm).status_code == 200
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "calm"}).status_code == 200
    (engine,) = pids(server, "engine")
    os.kill(engine, signal.SIGKILL)
    wait_until(lambda: pids(server, "engine") not in ([], [engine]), what="a new engine")
    wait_until(lambda: ready(server), what="the restarted engine")
    try:
        assert chat(client, "shout", 2).choices[0].message.content == reference_text("shout", 2)
        with pytest.raises(openai.NotFoundError):
            chat(client, "calm")
        assert {m.id for m in client.models.list().data} == {TINY_LLM, "zen", "shout"}
    finally:  # as the module's other tests expect: zen served, shout not
        post(server, "/v1/unload_lora_adapter", {"lora_name": "shout"})


@pytest.mark.parametrize("server", [2], indirect=True, ids=["api2"])
def test_a_load_after_an_api_process_exited_waits_for_no_answer_from_it(server):
    """Every API process acknowledges an adapter change before the load is answered; one that
    exited is let off at once, not waited for until the acknowledgement's bound."""
    victim = pids(server, "api")[0]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: gone(victim), what="the API process to exit")
    shout = {"lora_name": "shout", "lora_path": "shout/shout.onnx_adapter"}
    assert post(server, "/v1/load_lora_adapter", shout).status_code == 200
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "shout"}).status_code == 200
    # The engine logs each acknowledgement it stopped waiting for.
    assert "did not answer" not in server.log()


def test_unload_while_streaming_lets_the_stream_finish(client, server):
    # A copy of zen loaded at runtime: the configured one is not a client's to unload.
    calm = {"lora_name": "calm", "lora_path": "zen/zen.onnx_adapter"}
    assert post(server, "/v1/load_lora_adapter", calm).status_code == 200
    body = {
        "model": "calm",
        "messages": REFERENCE["zen"]["cases"][0]["messages"],
        "max_tokens": 300,
        "temperature": 0,
        "stream": True,
    }
    unload: list[httpx.Response] = []
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=60
    ) as response:
        events = response.iter_lines()
        seen = [next(events) for _ in range(6)]  # streaming has begun
        worker = threading.Thread(
            target=lambda: unload.append(
                post(server, "/v1/unload_lora_adapter", {"lora_name": "calm"})
            )
        )
        worker.start()
        seen += list(events)
    worker.join(60)
    data = [json.loads(e[6:]) for e in seen if e.startswith("data: {")]
    assert not any("error" in d for d in data)
    assert [d["choices"][0]["finish_reason"] for d in data if d["choices"]][-1] in (
        "stop",
        "length",
    )
    text = "".join(d["choices"][0]["delta"].get("content") or "" for d in data if d["choices"])
    assert text.startswith(reference_text("zen", 0))
    assert unload and unload[0].status_code == 200
    with pytest.raises(openai.NotFoundError):
        chat(client, "calm")
