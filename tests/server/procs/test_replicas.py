"""`replicas = 2`: whole servers on one port, each with its own models (server/procs/replicas.py).

The drain on SIGTERM runs in tests/server/test_shutdown.py, with the other layouts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from ferry.bench.api_servers import process_roles
from ferry.bench.processes import free_port
from ferry.bench.server_process import REPO, default_model_config, ferry_server, write_config
from tests.support.llm_configs import tiny_llm_config
from tests.support.metrics import metric_value
from tests.support.server_processes import (
    api_process_of,
    gone,
    pids,
    ready,
    wait_until,
)

pytestmark = pytest.mark.integration

QUEUE = 100  # each replica's bound: /metrics shows the server's, the sum
MODEL = default_model_config(backend={"sessions": 1}, batching={"max_queue_size": QUEUE})
TEXT = {"inputs": ["a ferry across the river"]}


@pytest.fixture(scope="module")
def server():
    with ferry_server([MODEL], server={"replicas": 2, "drain_timeout_s": 30}) as handle:
        wait_until(lambda: len(pids(handle, "replica")) == 2, what="two replicas")
        wait_until(lambda: ready(handle), what="both replicas ready")
        yield handle


async def held_by_each(server, per_replica: int = 1) -> dict[int, list[httpx.AsyncClient]]:
    """Keep-alive connections, `per_replica` held by each replica (whichever accepts first
    takes a new one: open more until each has its share)."""
    held: dict[int, list[httpx.AsyncClient]] = {pid: [] for pid in pids(server, "replica")}
    for _ in range(100 * per_replica):
        if min(len(clients) for clients in held.values()) == per_replica:
            break
        client = httpx.AsyncClient(base_url=server.url, timeout=60)
        response = await client.get("/health/live")
        port = response.extensions["network_stream"].get_extra_info("client_addr")[1]
        clients = held[api_process_of(server, port, role="replica")]
        if len(clients) < per_replica:
            clients.append(client)
        else:
            await client.aclose()
    assert [len(clients) for clients in held.values()] == [per_replica] * len(held)
    return held


async def close_all(held: dict[int, list[httpx.AsyncClient]]) -> None:
    for clients in held.values():
        for client in clients:
            await client.aclose()


def test_each_replica_answers_on_the_one_port_with_no_engine_process(server):
    async def scenario() -> dict[int, list[int]]:
        held = await held_by_each(server)
        try:
            return {
                pid: [(await client.post("/predict", json=TEXT)).status_code for client in clients]
                for pid, clients in held.items()
            }
        finally:
            await close_all(held)

    answered = asyncio.run(scenario())
    assert len(answered) == 2 and all(statuses == [200] for statuses in answered.values())
    # Whole servers: no engine process to hop to, every child a replica.
    assert sorted(process_roles(server.pid).values()) == ["replica", "replica"]


def test_metrics_sum_the_counters_of_every_replica(server):
    per_replica = 5

    async def scenario() -> tuple[str, str]:
        held = await held_by_each(server)
        try:
            (first, *_), (second, *_) = held.values()
            before = (await first.get("/metrics")).text
            for client in (first, second):
                for _ in range(per_replica):
                    assert (await client.post("/predict", json=TEXT)).status_code == 200
            # Each replica's own /metrics shows the other's requests too.
            return before, (await second.get("/metrics")).text
        finally:
            await close_all(held)

    before, after = asyncio.run(scenario())

    def predicted(text: str) -> float:
        return metric_value(text, "ferry_requests_total", endpoint="/predict")

    assert predicted(after) == predicted(before) + 2 * per_replica
    assert metric_value(after, "ferry_batch_size_requests_sum") >= 2 * per_replica
    # A state each replica holds: 1 where every replica has the model, not a sum of them.
    assert metric_value(after, "ferry_model_ready", model=MODEL["name"]) == 1
    assert metric_value(after, "ferry_queue_capacity", model=MODEL["name"]) == 2 * QUEUE
    assert 'pid="' not in after


def test_readiness_waits_for_every_replica(server):
    """A killed replica is replaced; until its successor serves, the survivor answers 503."""
    victim, survivor = pids(server, "replica")
    body = httpx.get(f"{server.url}/health/ready", timeout=10).json()
    assert body["replicas"] == {"ready": 2, "total": 2}
    os.kill(victim, signal.SIGKILL)
    successor = wait_until(
        lambda: next((p for p in pids(server, "replica") if p not in (victim, survivor)), None),
        what="the successor",
    )
    # Held before it could load its models (seconds of imports and a session away): the
    # survivor alone accepts, and it sees the server not yet whole.
    os.kill(successor, signal.SIGSTOP)
    try:
        response = httpx.get(f"{server.url}/health/ready", timeout=10)
        assert response.status_code == 503
        assert response.json()["status"] == "starting"
        assert response.json()["replicas"] == {"ready": 1, "total": 2}
        # The survivor serves meanwhile.
        assert httpx.post(f"{server.url}/predict", json=TEXT, timeout=30).status_code == 200
    finally:
        os.kill(successor, signal.SIGCONT)
    wait_until(lambda: ready(server), what="the successor ready")
    assert sorted(pids(server, "replica")) == sorted([survivor, successor])


def test_a_stop_ends_every_replica_with_status_0(server):
    # Last in this module: it ends the module's server.
    replicas = pids(server, "replica")
    assert server.stop() == 0
    assert all(gone(pid) for pid in replicas)


def start(tmp_path: Path, server: dict[str, Any], **config: Any) -> subprocess.CompletedProcess:
    path = write_config(tmp_path / "ferry.toml", server=server, **config)
    command = [sys.executable, "-m", "ferry", "serve", "--config", str(path)]
    command += ["--port", str(free_port()), "--log-level", "info"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO, env=env)


def test_replicas_with_api_servers_is_refused_at_start(tmp_path):
    run = start(tmp_path, {"replicas": 2, "api_servers": 2}, models=[MODEL])
    assert run.returncode != 0
    assert "replicas = 2 and api_servers = 2: two layouts, set one of them" in run.stderr


def test_replicas_with_an_llm_is_refused_at_start_naming_the_setting(tmp_path):
    run = start(tmp_path, {"replicas": 2}, models=[], llm_models=[tiny_llm_config()])
    assert run.returncode != 0
    assert "replicas = 2 would load every LLM (llm_models: tiny-llm) 2 times" in run.stderr


def test_replicas_that_cannot_start_stop_the_server_with_status_1(tmp_path):
    """A bad model fails every replica: no restart loop, status 1; the log says the layout."""
    run = start(tmp_path, {"replicas": 2}, models=[{**MODEL, "outputs": ["no_such_output"]}])
    assert run.returncode == 1, run.stderr[-2000:]
    assert "2 replicas on one port (replicas = 2)" in run.stderr
    assert "no_such_output" in run.stderr and "a replica failed to start" in run.stderr
    assert list(tmp_path.glob("ferry-*")) == []  # the run's directory removed
