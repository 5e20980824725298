"""`api_servers = 2`: one server to the outside, and the process faults.

The route suites run in this mode through their own fixtures (predict, KServe HTTP and gRPC,
OpenAI chat, shutdown); this module covers what only exists with several processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema
import numpy as np
import onnxruntime
import openai
import pytest
import tritonclient.http as triton_http

from ferry.bench.api_servers import process_roles
from ferry.bench.processes import free_port
from ferry.bench.server_process import (
    DEFAULT_MODEL,
    REPO,
    TINY_LLM,
    default_model_config,
    ferry_server,
    write_config,
)
from ferry.server.large_bodies import LARGE_BODY_BYTES
from ferry.server.procs.arena import ARENA_DIR, arena_prefix
from ferry.server.procs.engine_main import STATS_EVERY_S
from tests.support import plain_graphs
from tests.support.llm_configs import tiny_llm_config
from tests.support.metrics import metric_value
from tests.support.server_processes import gone, pids, readiness, ready, wait_until

pytestmark = pytest.mark.integration

# Greedy on this prompt runs to max_tokens (no end token): long enough to be cut.
CHAT = {
    "model": TINY_LLM,
    "messages": [{"role": "user", "content": "def fibonacci(n):"}],
    "max_tokens": 2000,
    "temperature": 0,
}
# The engine's silence that ends what waits on it (and turns readiness 503).
HEARTBEAT_S = 5.0  # the default: a loaded machine may delay a report by seconds
# An image's values as one row of the masked graph: its FP32 data and INT64 mask, both past
# engine_shm_min_bytes (64 KiB), so each request takes one block of this size in its arena.
PIXELS = 3 * 224 * 224
REQUEST_BYTES = PIXELS * (4 + 8)
ARENA_BYTES = 4 * REQUEST_BYTES + REQUEST_BYTES // 2  # four requests' blocks, not five
UNANSWERED = "ferry_engine_unanswered_bytes"
SHM_USED = "ferry_engine_shm_used_bytes"
FALLBACKS = "ferry_engine_shm_fallbacks_total"
OUTPUTS = ("mean", "masked")


@pytest.fixture(scope="module")
def server_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's TMPDIR: where its `ferry-*` run directory goes, watched by the tests."""
    return tmp_path_factory.mktemp("server-tmp")


def run_dirs(server_tmp: Path) -> list[Path]:
    return sorted(server_tmp.glob("ferry-*"))


@pytest.fixture(scope="module")
def server(server_tmp: Path):
    model = default_model_config(backend={"sessions": 1})
    graph = plain_graphs.masked_mean(server_tmp / "masked_mean.onnx")  # a plain graph beside it
    with ferry_server(
        [model],
        server={
            "api_servers": 2,
            "drain_timeout_s": 30,
            "engine_heartbeat_timeout_s": HEARTBEAT_S,
            "engine_shm_arena_bytes": ARENA_BYTES,
        },
        llm_models=[tiny_llm_config(max_running=8)],
        env={"TMPDIR": str(server_tmp)},
        args=["--model", f"masked={graph}"],
    ) as handle:
        wait_until(lambda: len(pids(handle, "api")) == 2, what="two API processes")
        yield handle


def arenas(run: Path) -> list[Path]:
    """The run's API processes' arenas in /dev/shm."""
    return sorted(ARENA_DIR.glob(arena_prefix(str(run)) + "*"))


def arena_pids(server_tmp: Path) -> list[int]:
    (run,) = run_dirs(server_tmp)
    return sorted(int(path.name.rsplit("-", 1)[1]) for path in arenas(run))


def predict(server, client: httpx.Client | None = None) -> int:
    body = {"inputs": ["a ferry across the river"]}
    if client is None:  # a new connection each time: any API process may take it
        return httpx.post(f"{server.url}/predict", json=body, timeout=30).status_code
    return client.post("/predict", json=body).status_code


def test_metrics_count_the_requests_of_every_api_process_once(server):
    before = metric_value(server.metrics(), "ferry_requests_total", endpoint="/predict")

    async def burst() -> list[int]:
        async def one() -> int:
            # One connection per request, all open at once: both processes accept some.
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                r = await client.post("/predict", json={"inputs": ["x"]})
                return r.status_code

        return await asyncio.gather(*(one() for _ in range(40)))

    assert asyncio.run(burst()) == [200] * 40
    text = server.metrics()
    assert metric_value(text, "ferry_requests_total", endpoint="/predict") == before + 40
    # Batch metrics come from the engine process, under the same names and labels.
    assert metric_value(text, "ferry_batch_size_requests_sum") >= 40
    assert metric_value(text, "ferry_model_ready", model="all-MiniLM-L6-v2") == 1
    # Gauges carry no `pid` label: every family keeps a single-process server's labels.
    assert 'pid="' not in text


def test_grammars_tool_calls_and_responses_cross_to_the_engine(server):
    """What the API process compiles (a JSON schema, a forced tool call's grammar) reaches the
    engine process and binds its output, on chat completions and on the Responses API."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    }
    common = {"model": TINY_LLM, "temperature": 0}
    hello = [{"role": "user", "content": "hello"}]
    answer = client.chat.completions.create(
        **common,
        messages=hello,
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    jsonschema.validate(json.loads(answer.choices[0].message.content), schema)
    tool = {"type": "function", "function": {"name": "where", "parameters": schema}}
    called = client.chat.completions.create(
        **common,
        messages=hello,
        max_tokens=40,
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "where"}},
    )
    (call,) = called.choices[0].message.tool_calls
    assert call.function.name == "where"
    jsonschema.validate(json.loads(call.function.arguments), schema)
    response = client.responses.create(
        **common,
        input="hello",
        max_output_tokens=40,
        text={"format": {"type": "json_schema", "name": "c", "schema": schema, "strict": True}},
    )
    jsonschema.validate(json.loads(response.output_text), schema)


def test_a_killed_api_process_is_replaced_and_the_other_keeps_serving(server, server_tmp):
    before = metric_value(server.metrics(), "ferry_requests_total", endpoint="/predict")
    victim, survivor = pids(server, "api")
    os.kill(victim, signal.SIGKILL)
    statuses = [predict(server) for _ in range(10)]
    assert statuses == [200] * 10
    wait_until(
        lambda: victim not in pids(server, "api") and len(pids(server, "api")) == 2,
        what="a new API process",
    )
    assert survivor in pids(server, "api")
    wait_until(lambda: ready(server), what="readiness")
    # The dead one's arena removed by the supervisor; its successor makes its own.
    wait_until(lambda: arena_pids(server_tmp) == pids(server, "api"), what="one arena each")
    # The dead process's requests stay counted: counters never go down.
    after = metric_value(server.metrics(), "ferry_requests_total", endpoint="/predict")
    assert after >= before + 10


def test_a_dead_engine_fails_every_waiting_request_with_503_then_comes_back(server):
    (engine,) = pids(server, "engine")

    async def scenario() -> tuple[list[int], list[str], int, list[int]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            first_delta = asyncio.Event()

            async def stream() -> list[str]:
                lines = []
                body = {**CHAT, "stream": True}
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if line.startswith("data:"):
                            lines.append(line)
                            first_delta.set()
                return lines

            async def chat() -> int:
                return (await client.post("/v1/chat/completions", json=CHAT)).status_code

            async def predicts() -> list[int]:
                body = {"inputs": ["a ferry across the river"] * 8}
                sent = [client.post("/predict", json=body) for _ in range(64)]
                return [r.status_code for r in await asyncio.gather(*sent)]

            streaming = asyncio.create_task(stream())
            chats = [asyncio.create_task(chat()) for _ in range(3)]
            await first_delta.wait()
            burst = asyncio.create_task(predicts())
            await asyncio.sleep(0)  # the burst is on its way when the engine dies
            os.kill(engine, signal.SIGKILL)
            statuses = await asyncio.gather(*chats)
            lines = await streaming
            readiness = (await client.get("/health/ready")).status_code
            return statuses, lines, readiness, await burst

    statuses, lines, readiness, predicted = asyncio.run(scenario())
    # Every waiting request ends, with a 503 (a stream: an error event, then [DONE]).
    assert statuses == [503, 503, 503]
    # Encoder requests too: answered before the death, or refused with 503; none hangs.
    assert set(predicted) <= {200, 503} and len(predicted) == 64
    assert '"code": 503' in lines[-2].replace('"code":503', '"code": 503')
    assert lines[-1] == "data: [DONE]"
    assert readiness == 503
    wait_until(lambda: ready(server), what="the restarted engine")
    assert pids(server, "engine") != [engine]
    assert predict(server) == 200


def test_after_an_engine_restart_no_api_process_is_ready_until_every_one_serves_the_new_engine(
    server,
):
    """A probe reaches one API process and the next request perhaps another: one that has not
    reconnected to the new engine keeps every one at 503."""
    (engine,) = pids(server, "engine")
    lagging = pids(server, "api")[0]

    def probe() -> httpx.Response:
        return httpx.get(f"{server.url}/health/ready", timeout=10)

    # Stopped, it neither sees the engine die nor greets the new one; the other alone accepts.
    os.kill(lagging, signal.SIGSTOP)
    try:
        os.kill(engine, signal.SIGKILL)
        wait_until(lambda: pids(server, "engine") not in ([], [engine]), what="a new engine")
        wait_until(lambda: all(probe().json()["models"].values()), what="the new engine's models")
        response = probe()
        assert response.status_code == 503
        assert response.json()["status"] == "starting"
        assert response.json()["api_servers"] == {"ready": 1, "total": 2}
        assert predict(server) == 200  # the other serves meanwhile
    finally:
        os.kill(lagging, signal.SIGCONT)
    wait_until(lambda: ready(server), what="every API process on the new engine")
    assert probe().json()["api_servers"] == {"ready": 2, "total": 2}


def test_an_engine_that_cannot_start_stops_the_server_with_status_1(tmp_path):
    """No restart loop for a bad configuration: the API processes are ended, status 1, and
    the run's directory is removed."""
    model = default_model_config(outputs=["no_such_output"])
    config = write_config(tmp_path / "ferry.toml", [model], {"api_servers": 2})
    command = [sys.executable, "-m", "ferry", "serve", "--config", str(config)]
    command += ["--port", str(free_port()), "--log-level", "warning"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "no_such_output" in run.stderr and "failed to start" in run.stderr
    assert run_dirs(tmp_path) == []


# A text for the encoder, tensors for the plain graph: each request's deadline.
DEADLINED = {
    "text": {"inputs": ["a ferry across the river"], "timeout_ms": 1000},
    "graph": {
        "model": "masked",
        "inputs": {"data": [[1.0, 2.0]], "mask": [[1, 0]]},
        "timeout_ms": 1000,
    },
}


@pytest.mark.parametrize("kind", list(DEADLINED))
def test_a_stopped_engine_gets_504_at_the_deadline_and_readiness_turns_503(server, kind):
    """SIGSTOP: the engine lives but never answers. The API process keeps the deadline itself,
    and readiness sees the engine's silence; both before the engine resumes."""
    (engine,) = pids(server, "engine")
    body = DEADLINED[kind]
    os.kill(engine, signal.SIGSTOP)
    try:
        # (a client timeout only so that a regression fails instead of hanging)
        status = httpx.post(f"{server.url}/predict", json=body, timeout=60).status_code
        wait_until(lambda: readiness(server) == 503, what="readiness 503")
    finally:
        os.kill(engine, signal.SIGCONT)
    assert status == 504
    wait_until(lambda: ready(server), what="readiness once the engine resumed")
    assert predict(server) == 200


def test_a_deadline_the_model_cannot_meet_is_refused_by_the_api_process_alone(server):
    """The floor is decided where the request is validated, from the engine's reported row
    time: a 422 even from a stopped engine, not a round trip that races the 1 ms timer here
    (a 504 beside a CPU hog when the engine checked it)."""
    ids = [101] + [7592] * 254 + [102]  # MiniLM needs several times 1 ms for 256 tokens
    for _ in range(8):  # rows of this length, so the fitted line knows them
        assert httpx.post(f"{server.url}/predict", json={"input_ids": ids}).status_code == 200
    unmeetable = {"input_ids": ids, "timeout_ms": 1}
    wait_until(
        lambda: httpx.post(f"{server.url}/predict", json=unmeetable).status_code == 422,
        what="the engine's fitted floor",
    )
    time.sleep(4 * STATS_EVERY_S)  # the engine's next reports carry the fit
    (engine,) = pids(server, "engine")
    os.kill(engine, signal.SIGSTOP)
    try:
        answer = httpx.post(f"{server.url}/predict", json=unmeetable, timeout=60)
    finally:
        os.kill(engine, signal.SIGCONT)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["param"] == "timeout_ms"


def test_a_stopped_engine_ends_chats_with_503_after_its_heartbeat_timeout(server):
    """SIGSTOP: no delta and no heartbeat. Chats have no deadline, yet none waits on a silent
    engine past `engine_heartbeat_timeout_s` (and its check): a started stream ends with an error
    event, others with a 503. The engine, once resumed, aborts what it was generating."""
    (engine,) = pids(server, "engine")

    async def scenario() -> tuple[list[str], httpx.Response, httpx.Response]:
        # Well under max_tokens' run, well over the bound (the watch fires within 1.25x).
        async with httpx.AsyncClient(base_url=server.url, timeout=3 * HEARTBEAT_S) as client:
            first_delta = asyncio.Event()

            async def stream() -> list[str]:
                body = {**CHAT, "stream": True}
                try:
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        assert r.status_code == 200
                        lines = []
                        async for line in r.aiter_lines():
                            if line.startswith("data:"):
                                lines.append(line)
                                first_delta.set()
                        return lines
                finally:
                    first_delta.set()  # a failure is raised below, not waited for

            streaming = asyncio.create_task(stream())
            await first_delta.wait()
            os.kill(engine, signal.SIGSTOP)
            try:
                chat, late_stream = await asyncio.gather(
                    client.post("/v1/chat/completions", json=CHAT),
                    client.post("/v1/chat/completions", json={**CHAT, "stream": True}),
                )
                return await streaming, chat, late_stream
            finally:
                os.kill(engine, signal.SIGCONT)

    lines, chat, late_stream = asyncio.run(scenario())
    assert '"code": 503' in lines[-2].replace('"code":503', '"code": 503')
    assert lines[-1] == "data: [DONE]"
    for response in (chat, late_stream):
        assert response.status_code == 503
        assert "retry-after" in response.headers
        assert "sent nothing" in response.json()["error"]["message"]
    wait_until(lambda: ready(server), what="readiness once the engine resumed")
    # Aborted, not run on to max_tokens for nobody.
    wait_until(
        lambda: metric_value(server.metrics(), "ferry_llm_requests_running", model=TINY_LLM) == 0,
        what="no generation running",
    )
    again = {**CHAT, "max_tokens": 5}
    assert httpx.post(f"{server.url}/v1/chat/completions", json=again, timeout=60).is_success


def test_the_generations_of_an_exited_api_process_are_aborted_in_the_engine(server):
    """Nobody reads them any more: the engine stops them instead of running to max_tokens."""
    assert metric_value(server.metrics(), "ferry_llm_requests_running", model=TINY_LLM) == 0

    async def stream_then_kill() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            body = {**CHAT, "stream": True}
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                async for line in response.aiter_lines():
                    chunk = json.loads(line[6:]) if line.startswith("data: {") else {}
                    if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                        break  # the engine generates it: its API process dies (whichever)
                for api in pids(server, "api"):
                    os.kill(api, signal.SIGKILL)

    asyncio.run(stream_then_kill())
    # The engine logs, per exited API process, what it aborted: one generation in all.
    wait_until(lambda: "generations aborted: 1," in server.log(), what="the abort")
    wait_until(lambda: ready(server), what="new API processes")
    wait_until(
        lambda: metric_value(server.metrics(), "ferry_llm_requests_running", model=TINY_LLM) == 0,
        what="no generation running",
    )


def image_rows(seed: int, pixels: int = PIXELS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    # Whole numbers: every sum is exact, in whatever order a runtime adds them.
    data = rng.integers(0, 16, (1, pixels)).astype(np.float32)
    return {"data": data, "mask": rng.integers(0, 2, (1, pixels), dtype=np.int64)}


def triton_infer(server, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One request by tritonclient (binary tensors), on a connection of its own."""
    client = triton_http.InferenceServerClient(
        server.url.removeprefix("http://"), network_timeout=60
    )
    try:
        inputs = []
        for name, datatype in (("data", "FP32"), ("mask", "INT64")):
            tensor = triton_http.InferInput(name, list(feeds[name].shape), datatype)
            tensor.set_data_from_numpy(feeds[name])
            inputs.append(tensor)
        outputs = [triton_http.InferRequestedOutput(n, binary_data=True) for n in OUTPUTS]
        result = client.infer("masked", inputs, outputs=outputs)
        return {name: result.as_numpy(name) for name in OUTPUTS}
    finally:
        client.close()


def test_image_tensors_cross_in_the_arena_or_as_frames_and_answer_as_in_one_process(
    server, server_tmp: Path
):
    """Twelve image-sized requests while the engine is stopped: each API process's arena holds
    four of them, the others fall back to frames. Every answer, either way, is the graph's
    answer in one process (api_servers = 1), and the blocks are free once answered."""
    session = onnxruntime.InferenceSession(str(server_tmp / "masked_mean.onnx"))
    requests = [image_rows(seed) for seed in range(12)]
    before = metric_value(server.metrics(), FALLBACKS)
    (engine,) = pids(server, "engine")
    pool = ThreadPoolExecutor(len(requests))
    os.kill(engine, signal.SIGSTOP)
    try:
        answers = [pool.submit(triton_infer, server, feeds) for feeds in requests]
        wait_until(
            lambda: metric_value(server.metrics(), UNANSWERED) == len(requests) * REQUEST_BYTES,
            what="every request sent",
        )
        # Each process holds min(its requests, 4) blocks; every other request fell back.
        held = metric_value(server.metrics(), SHM_USED) // REQUEST_BYTES
        assert 4 <= held <= 8
        wait_until(
            lambda: metric_value(server.metrics(), FALLBACKS) == before + len(requests) - held,
            what="the fallbacks counted",
        )
    finally:
        os.kill(engine, signal.SIGCONT)
        pool.shutdown(wait=True)
    for feeds, answer in zip(requests, answers, strict=True):
        expected = dict(zip(OUTPUTS, session.run(list(OUTPUTS), feeds), strict=True))
        np.testing.assert_array_equal(answer.result()["masked"], expected["masked"])
        np.testing.assert_array_equal(answer.result()["mean"], expected["mean"])
    wait_until(lambda: metric_value(server.metrics(), SHM_USED) == 0, what="every block free")


def test_every_block_is_free_again_after_answers_disconnects_and_deadlines(server):
    """A burst while the engine is stopped: requests answered, requests whose client left
    (the engine reads each one's cancel before it starts: the Reply to the cancel is all it
    answers) and requests with a 1 ms deadline (a 504 here; refused by the engine when it
    resumes, a Failed): the engine's answer to each frees its block. A quarter image each:
    all nine fit in either arena, however the two processes share them (none falls back)."""
    (engine,) = pids(server, "engine")
    feeds = image_rows(99, PIXELS // 4)
    block = REQUEST_BYTES // 4
    body = {"model": "masked", "inputs": {k: v.tolist() for k, v in feeds.items()}}
    body["outputs"] = ["mean"]
    before = server.metrics()
    refused = metric_value(before, "ferry_rejections_total", reason="deadline")
    fallbacks = metric_value(before, FALLBACKS)

    def all_held(text: str) -> bool:
        return metric_value(text, UNANSWERED) == metric_value(text, SHM_USED) == 9 * block

    async def scenario() -> tuple[list[int], list[int]]:
        async def post(extra: dict[str, int], timeout_s: float) -> int:
            async with httpx.AsyncClient(base_url=server.url, timeout=timeout_s) as client:
                try:
                    return (await client.post("/predict", json={**body, **extra})).status_code
                except httpx.TimeoutException:
                    return 0  # the client left: its connection closed

        answered = [asyncio.create_task(post({}, 60)) for _ in range(3)]
        expired = [asyncio.create_task(post({"timeout_ms": 1}, 60)) for _ in range(3)]
        left = [asyncio.create_task(post({}, 3)) for _ in range(3)]
        while not all_held(await asyncio.to_thread(server.metrics)):
            await asyncio.sleep(0.05)
        ended = await asyncio.gather(*expired, *left)
        os.kill(engine, signal.SIGCONT)
        return await asyncio.gather(*answered), ended

    os.kill(engine, signal.SIGSTOP)
    try:
        statuses, ended = asyncio.run(scenario())
    finally:
        os.kill(engine, signal.SIGCONT)
    assert statuses == [200] * 3
    assert ended == [504] * 3 + [0] * 3
    assert metric_value(server.metrics(), FALLBACKS) == fallbacks
    wait_until(
        lambda: (
            metric_value(server.metrics(), "ferry_rejections_total", reason="deadline")
            == refused + 3
        ),
        what="the engine's refusals",
    )
    wait_until(
        lambda: (
            metric_value(server.metrics(), SHM_USED) == 0
            and metric_value(server.metrics(), UNANSWERED) == 0
        ),
        what="every block free",
    )


def test_a_killed_supervisor_takes_its_processes_with_it_and_the_next_start_cleans_up(
    server, server_tmp: Path
):
    # Last in this module: it ends the module's server.
    children = list(process_roles(server.pid))
    assert len(children) == 3
    (left,) = run_dirs(server_tmp)  # the engine socket, metric files, adapter journal
    assert len(arenas(left)) == 2  # one per API process
    server.process.kill()
    server.process.wait()
    wait_until(lambda: all(gone(pid) for pid in children), what="the orphans to stop")
    assert run_dirs(server_tmp) == [left]  # a killed process removes nothing
    model = default_model_config(backend={"sessions": 1})
    env = {"TMPDIR": str(server_tmp)}
    with ferry_server([model], server={"api_servers": 2}, env=env) as handle:
        # The next start removed the dead run's directory; its own is removed at SIGTERM.
        (own,) = run_dirs(server_tmp)
        assert own != left
        assert len(arenas(own)) == 2
        assert handle.stop() == 0
    assert run_dirs(server_tmp) == []
    assert arenas(left) == arenas(own) == []  # gone from /dev/shm


def test_api_processes_that_parsed_large_bodies_in_workers_still_exit():
    """An API process joins its children as it exits: the JSON workers (server/json_bodies.py)
    must be told to end first, or it waits for them forever (it did, orphaned, after SIGTERM)."""
    model = default_model_config(backend={"sessions": 1})
    ids = {"name": "input_ids", "shape": [1, 4], "datatype": "INT64", "data": [101, 7, 8, 102]}
    body = json.dumps({"inputs": [ids]}).encode() + b" " * LARGE_BODY_BYTES  # a worker parses it
    with ferry_server([model], server={"api_servers": 2}) as server:
        for _ in range(4):  # over both API processes
            reply = httpx.post(
                f"{server.url}/v2/models/{DEFAULT_MODEL}/infer",
                content=body,
                headers={"content-type": "application/json"},
                timeout=60,
            )
            assert reply.status_code == 200, reply.text
        children = list(process_roles(server.pid))
    wait_until(lambda: all(gone(pid) for pid in children), what="the API processes to exit")
