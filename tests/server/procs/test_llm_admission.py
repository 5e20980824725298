"""LLM admission with `api_servers = 2`: the engine process admits each request's generations,
all or none, for every API process at once (server/procs/llm_admission.py)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from ferry.bench.server_process import TINY_LLM, ferry_server
from ferry.llm.errors import EngineOverloaded
from ferry.server.procs.llm_admission import Tickets
from tests.support.llm_configs import tiny_llm_config
from tests.support.metrics import metric_value
from tests.support.server_processes import api_process_of, pids, wait_until

pytestmark = pytest.mark.integration

MAX_RUNNING, MAX_WAITING = 2, 2
CAPACITY = MAX_RUNNING + MAX_WAITING
PER_PROCESS, ROUNDS = 6, 4  # connections per API process, requests per connection


class Engine:
    """What admission reads of an engine."""

    name = TINY_LLM
    max_concurrent_generations = CAPACITY


def test_tickets_hold_their_slots_until_released_or_ended():
    tickets = Tickets()
    tickets.admit((b"a", 1), Engine(), 3)  # type: ignore[arg-type]  # duck-typed
    with pytest.raises(EngineOverloaded):  # 3 + 2 > 4: none of the 2
        tickets.admit((b"b", 1), Engine(), 2)  # type: ignore[arg-type]
    assert tickets.start((b"a", 1)) and tickets.start((b"a", 1))
    tickets.release((b"a", 1))  # its third never started: free; two still run
    assert not tickets.start((b"a", 1))
    tickets.admit((b"b", 2), Engine(), 2)  # type: ignore[arg-type]
    tickets.end(TINY_LLM)
    tickets.release_all(b"b")  # an exited API process: its unused slots too
    tickets.admit((b"c", 1), Engine(), 3)  # type: ignore[arg-type]
    with pytest.raises(EngineOverloaded):
        tickets.admit((b"c", 2), Engine(), 1)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def server():
    config = tiny_llm_config(max_running=MAX_RUNNING, max_waiting=MAX_WAITING)
    with ferry_server([], server={"api_servers": 2}, llm_models=[config]) as handle:
        wait_until(lambda: len(pids(handle, "api")) == 2, what="two API processes")
        yield handle


def finished(text: str, reason: str) -> float:
    return metric_value(text, "ferry_llm_requests_finished_total", finish_reason=reason)


async def connections(server, per_process: int) -> list[httpx.AsyncClient]:
    """Keep-alive connections, `per_process` held by each API process: both take the load."""
    held: dict[int, list[httpx.AsyncClient]] = {pid: [] for pid in pids(server, "api")}
    for _ in range(50 * per_process):  # each lands on either, whichever accepts first
        if min(len(clients) for clients in held.values()) == per_process:
            break
        client = httpx.AsyncClient(base_url=server.url, timeout=120)
        response = await client.get("/health/live")
        port = response.extensions["network_stream"].get_extra_info("client_addr")[1]
        clients = held[api_process_of(server, port)]
        if len(clients) < per_process:
            clients.append(client)
        else:
            await client.aclose()
    assert [len(clients) for clients in held.values()] == [per_process] * 2
    return [client for clients in zip(*held.values(), strict=True) for client in clients]


async def chat(client: httpx.AsyncClient, n: int, stream: bool) -> tuple[httpx.Response, list]:
    """The response, and its events (a stream's chunks, or the body)."""
    body = {
        "model": TINY_LLM,
        "messages": [{"role": "user", "content": "tell me a story"}],
        "max_tokens": 24,
        "n": n,
        "stream": stream,
    }
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = [line async for line in response.aiter_lines()]
    if not stream or response.status_code != 200:
        return response, [json.loads("".join(lines))]
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]", data[-2:]
    return response, [json.loads(event) for event in data[:-1]]


def test_overload_admits_each_request_whole_or_refuses_it_whole(server):
    """Requests of n = 2 and 3 from both API processes against a capacity of 4: one fits at a
    time. Each is answered with all its choices or refused with a 429 before any of them ran
    (none ends as `abort`), and the engine never holds more than its capacity."""
    before = server.metrics()
    load: list[tuple[float, float]] = []  # (running, waiting) as the engine reported them

    async def burst() -> list[tuple[int, httpx.Response, list]]:
        clients = await connections(server, PER_PROCESS)
        done = asyncio.Event()

        async def sample() -> None:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                while not done.is_set():
                    text = (await client.get("/metrics")).text
                    running = metric_value(text, "ferry_llm_requests_running", model=TINY_LLM)
                    waiting = metric_value(text, "ferry_llm_requests_waiting", model=TINY_LLM)
                    load.append((running, waiting))

        async def requests(i: int, client: httpx.AsyncClient) -> list:
            answers = []
            for round_ in range(ROUNDS):  # one request at a time on a connection
                n, stream = 2 + (i + round_) % 2, (i // 2 + round_) % 2 == 1
                answers.append((n, *await chat(client, n, stream)))
            await client.aclose()
            return answers

        sampler = asyncio.create_task(sample())
        per_client = await asyncio.gather(*(requests(i, c) for i, c in enumerate(clients)))
        done.set()
        await sampler
        return [answer for answers in per_client for answer in answers]

    results = asyncio.run(burst())
    refused = 0
    for n, response, events in results:
        if response.status_code == 429:
            assert "retry-after" in response.headers
            assert events[0]["error"]["type"] == "overloaded_error"
            refused += n
            continue
        assert response.status_code == 200, events
        assert not any("error" in event for event in events)
        choices = [c for event in events for c in event["choices"]]  # stream chunks or a body
        reasons = {c["index"]: c["finish_reason"] for c in choices if c["finish_reason"]}
        assert set(reasons) == set(range(n)) and set(reasons.values()) <= {"stop", "length"}
    assert 0 < refused < sum(n for n, _, _ in results)  # an overload, and served through it
    after = server.metrics()
    assert finished(after, "abort") == finished(before, "abort")  # no refused request's ran
    assert finished(after, "rejected") - finished(before, "rejected") == refused
    assert load and all(r <= MAX_RUNNING and r + w <= CAPACITY for r, w in load)
