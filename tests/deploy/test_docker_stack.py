"""The compose stack for real: images built, `up`, checked from the host, `stop`, `down -v`.

Runs what deploy/docker-compose.local.yml documents, with Debian's docker-compose 1.29: the CPU
Ferry image, Prometheus and a CPU Triton, all built from the local Debian base
(tools/docker_base_image.sh), so no registry is needed. Grafana (no Debian package) is not started.
A small override adds one Ferry model served by Triton in passthrough mode over the compose
network. The engine is the running one or a dockerd started for this module
(tests/deploy/docker_engine.py).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from ferry.bench.processes import free_port
from ferry.bench.server_process import DEFAULT_MODEL_DIR
from tests.deploy.deploy_support import DEPLOY, ROOT
from tests.deploy.docker_engine import docker, docker_engine
from tests.exporters.triton_models import TRITON_MODELS, export_default
from tests.support.metrics import metric_value

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

FILES = ["-f", str(DEPLOY / "docker-compose.yml"), "-f", str(DEPLOY / "docker-compose.local.yml")]
# Ferry's own config plus a model whose batches Triton runs (reached by its service name).
TRITON_MODEL = """
[[models]]
name = "minilm-triton"
path = "artifacts/models/all-MiniLM-L6-v2"
outputs = ["sentence_embedding"]

[models.backend]
kind = "triton"
url = "triton:8001"
protocol = "grpc"
model = "all-MiniLM-L6-v2"
mode = "passthrough"
"""
# Debian's convention for locally added CAs (a TLS-intercepting proxy's, for one).
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
# Ferry's stop_grace_period in the compose file ("30s"): docker's SIGKILL comes after it.
STOP_GRACE_S = float(
    yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]["ferry"][
        "stop_grace_period"
    ].removesuffix("s")
)


@dataclass
class Stack:
    project: str
    files: list[str]
    env: dict[str, str]
    ferry_url: str
    prometheus_url: str

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        result = subprocess.run(
            ["docker-compose", "-p", self.project, *self.files, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )
        assert result.returncode == 0, f"docker-compose {' '.join(args)}:\n{result.stderr[-4000:]}"
        return result

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()

    def inspect(self, service: str, template: str) -> str:
        return docker("inspect", "-f", template, self.container(service))


def _extra_ca_certs() -> str:
    if "FERRY_EXTRA_CA_CERTS" in os.environ:
        return os.environ["FERRY_EXTRA_CA_CERTS"]
    return "".join(p.read_text() for p in sorted(LOCAL_CAS.glob("*.crt")))


def _wait_healthy(stack: Stack, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while (status := stack.inspect("ferry", "{{.State.Health.Status}}")) != "healthy":
        assert status in {"starting", "healthy"}, stack.compose("logs", "ferry").stdout[-4000:]
        assert time.monotonic() < deadline, "ferry never became healthy"
        time.sleep(1)


def _ferry_with_a_triton_model(folder: Path) -> Path:
    config = folder / "ferry.toml"
    config.write_text((ROOT / "ferry.toml").read_text() + TRITON_MODEL)
    override = folder / "docker-compose.triton-model.yml"
    override.write_text(
        yaml.safe_dump(
            {
                "services": {
                    "ferry": {
                        "volumes": [f"{config}:/app/ferry.toml:ro"],
                        "depends_on": {"triton": {"condition": "service_healthy"}},
                    }
                }
            }
        )
    )
    config.chmod(0o644)  # read by the container's uid 10001
    return override


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    # The `cpu` Triton flavour's model.py and weights are not committed: the exporter writes them
    # (as `make triton-models` does, triton_models/README.md).
    export_default(DEFAULT_MODEL_DIR, TRITON_MODELS / "cpu", "cpu", config_only=False)
    override = _ferry_with_a_triton_model(tmp_path_factory.mktemp("compose"))
    with docker_engine():
        base = subprocess.run(
            ["bash", str(ROOT / "tools/docker_base_image.sh")],
            capture_output=True,
            text=True,
            timeout=900,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        assert base.returncode == 0, base.stderr[-4000:]
        ferry_port, grpc_port, prometheus_port = free_port(), free_port(), free_port()
        env = {
            **os.environ,
            "FERRY_BASE_IMAGE": base.stdout.strip(),
            "FERRY_EXTRA_CA_CERTS": _extra_ca_certs(),
            "FERRY_HTTP_PORT": str(ferry_port),
            "FERRY_GRPC_PORT": str(grpc_port),
            "PROMETHEUS_PORT": str(prometheus_port),
            "COMPOSE_DOCKER_CLI_BUILD": "0",  # the legacy builder through the engine's API
        }
        project = f"ferrytest{uuid.uuid4().hex[:8]}"
        handle = Stack(
            project,
            [*FILES, "-f", str(override)],
            env,
            f"http://127.0.0.1:{ferry_port}",
            f"http://127.0.0.1:{prometheus_port}",
        )
        try:
            handle.compose("build", "--parallel", timeout=1200)
            handle.compose("up", "-d", "ferry", "prometheus", "triton", timeout=300)
            _wait_healthy(handle)
            yield handle
        finally:
            subprocess.run(
                ["docker-compose", "-p", project, *handle.files, "down", "-v", "--remove-orphans"],
                capture_output=True,
                env=env,
                timeout=300,
                stdin=subprocess.DEVNULL,
                check=False,
            )


def test_ferry_is_healthy_and_runs_as_a_non_root_user(stack):
    assert stack.inspect("ferry", "{{.State.Health.Status}}") == "healthy"
    assert stack.inspect("ferry", "{{.Config.User}}") == "10001:10001"
    uid = docker("exec", stack.container("ferry"), "id", "-u")
    assert uid == "10001"


def test_predict_and_chat_answer_through_the_published_port(stack):
    with httpx.Client(base_url=stack.ferry_url, timeout=60) as client:
        predict = client.post("/predict", json={"inputs": ["a container", "a ship"]})
        assert predict.status_code == 200, predict.text
        outputs = predict.json()["outputs"]
        assert len(outputs) == 2 and len(outputs[0]["sentence_embedding"]) == 384
        # The image serves the real default chat model (copied or converted in its build).
        question = [{"role": "user", "content": "What is the capital of France?"}]
        chat = client.post(
            "/v1/chat/completions",
            json={
                "model": "SmolLM2-135M-Instruct",
                "messages": question,
                "max_tokens": 12,
                "temperature": 0,
            },
        )
        assert chat.status_code == 200, chat.text
        message = chat.json()["choices"][0]["message"]
        assert message["role"] == "assistant" and "Paris" in message["content"]


def test_kserve_grpc_answers_through_the_published_port(stack):
    import tritonclient.grpc as triton_grpc

    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{stack.env['FERRY_GRPC_PORT']}")
    ids = np.array([[101, 7592, 2088, 102]], dtype=np.int64)
    tensor = triton_grpc.InferInput("input_ids", list(ids.shape), "INT64")
    tensor.set_data_from_numpy(ids)
    result = client.infer("all-MiniLM-L6-v2", [tensor])
    assert result.as_numpy("sentence_embedding").shape == (1, 384)


def test_ferry_passes_batches_through_to_triton_on_the_compose_network(stack):
    ids = [101, 7592, 2088, 2003, 1037, 3899, 102]
    with httpx.Client(base_url=stack.ferry_url, timeout=60) as client:
        embeddings = {}
        for model in ("all-MiniLM-L6-v2", "minilm-triton"):
            response = client.post("/predict", json={"model": model, "input_ids": [ids, ids[:4]]})
            assert response.status_code == 200, response.text
            embeddings[model] = [o["sentence_embedding"] for o in response.json()["outputs"]]
        metrics = client.get("/metrics").text
    for local, remote in zip(*embeddings.values(), strict=True):
        assert max(abs(a - b) for a, b in zip(local, remote, strict=True)) < 1e-4
    assert metric_value(metrics, "ferry_model_ready", model="minilm-triton") == 1


def test_prometheus_scrapes_ferry_with_every_alert_rule_loaded(stack):
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    expected = {r["alert"] for g in alerts["groups"] for r in g["rules"]}
    with httpx.Client(base_url=stack.prometheus_url, timeout=10) as client:
        deadline, targets = time.monotonic() + 120, []
        while True:  # the first scrape comes within one interval (5 s) of Prometheus starting
            try:
                targets = client.get("/api/v1/targets").json()["data"]["activeTargets"]
                health = {t["labels"]["job"]: t["health"] for t in targets}
                if health.get("ferry") == health.get("triton") == "up":
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"ferry and triton never scraped: {targets}"
            time.sleep(1)
        urls = {t["labels"]["job"]: t["scrapeUrl"] for t in targets}
        assert urls["ferry"] == "http://ferry:8000/metrics"  # over the compose network
        assert urls["triton"] == "http://triton:8002/metrics"
        groups = client.get("/api/v1/rules").json()["data"]["groups"]
        loaded = {r["name"] for g in groups for r in g["rules"] if r["type"] == "alerting"}
        assert loaded == expected
        up = client.get("/api/v1/query", params={"query": 'up{job="ferry"}'}).json()
        assert up["data"]["result"][0]["value"][1] == "1"


async def _fire(url: str, count: int) -> list[int | str]:
    ids = [101, *range(2000, 2062), 102]  # short: the drain must end well inside the grace period

    async def one(client: httpx.AsyncClient) -> int | str:
        try:
            return (await client.post("/predict", json={"input_ids": ids})).status_code
        except httpx.TransportError as exc:
            return type(exc).__name__

    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        return await asyncio.gather(*(one(client) for _ in range(count)))


def test_stop_drains_in_flight_requests_and_exits_zero(stack):
    # SIGTERM as `docker stop` sends it, from docker's own CLI: Compose v1 (Python) took long
    # enough to start beside a CPU hog that a fast host had answered every request before it
    # (a fresh clone's run logged "draining: 0 requests in flight").
    container = stack.container("ferry")

    async def scenario() -> tuple[list[int | str], float]:
        firing = asyncio.create_task(_fire(stack.ferry_url, 384))
        async with httpx.AsyncClient(base_url=stack.ferry_url, timeout=10) as probe:
            deadline = time.monotonic() + 60
            while True:
                text = (await probe.get("/metrics")).text
                accepted = metric_value(text, "ferry_in_flight_requests", endpoint="/predict")
                if accepted >= 8:
                    break
                assert time.monotonic() < deadline, "requests never arrived"
                await asyncio.sleep(0.05)
        # `docker stop` sends SIGTERM, then a SIGKILL after stop_grace_period (30 s): within it,
        # Ferry must have drained and exited by itself.
        await asyncio.to_thread(docker, "kill", "--signal", "TERM", container)
        exit_code = await asyncio.to_thread(docker, "wait", container, timeout=STOP_GRACE_S)
        assert exit_code == "0"
        return await firing, accepted

    statuses, accepted = asyncio.run(scenario())
    assert set(statuses) <= {200, 503}, f"lost requests: {set(statuses)}"
    assert statuses.count(200) >= accepted
    # 0, not 137: Ferry drained and exited by itself within the grace period.
    assert stack.inspect("ferry", "{{.State.ExitCode}} {{.State.OOMKilled}}") == "0 false"
    logs = stack.compose("logs", "ferry").stdout
    (in_flight,) = re.findall(r"draining: (\d+) requests in flight", logs)
    assert int(in_flight) > 0 and "drain timeout" not in logs


def test_down_removes_containers_network_and_volumes(stack):
    label = f"label=com.docker.compose.project={stack.project}"
    assert docker("volume", "ls", "-q", "--filter", label)  # prometheus-data exists until down
    stack.compose("down", "-v")
    for kind in ("container", "network", "volume"):
        listing = ["ls", "-aq"] if kind == "container" else ["ls", "-q"]
        assert docker(kind, *listing, "--filter", label) == "", kind
