"""deploy/docker-compose*.yml, checked without a Docker engine (test_docker_stack.py runs them).

Each file is validated against the Compose Specification JSON schema (schemas/compose-spec.json,
vendored from docker-compose 1.29.2's compose/config/compose_spec.json, Apache-2.0); the merged
files as docker-compose 1.29 resolves them (`config`) are then checked for cross-references:
files they mount exist, ports do not clash, GPUs are reserved only by the GPU file.
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from ferry.server.settings import load_settings
from tests.deploy.deploy_support import DEPLOY, ROOT

pytestmark = pytest.mark.system

BASE = DEPLOY / "docker-compose.yml"
GPU = DEPLOY / "docker-compose.gpu.yml"
LOCAL = DEPLOY / "docker-compose.local.yml"
SCHEMA = Path(__file__).parent / "schemas" / "compose-spec.json"
# Variables the files interpolate; unset here so that `config` shows the defaults.
VARIABLES = (
    "FERRY_HTTP_PORT",
    "PROMETHEUS_PORT",
    "GRAFANA_PORT",
    "FERRY_BASE_IMAGE",
    "FERRY_EXTRA_CA_CERTS",
)


def resolved(*files: Path) -> dict:
    """The merged, interpolated configuration, as docker-compose 1.29 prints it."""
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    args = [a for f in files for a in ("-f", str(f))]
    result = subprocess.run(
        ["docker-compose", *args, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


@pytest.fixture(scope="module")
def cpu() -> dict:
    return resolved(BASE)


@pytest.fixture(scope="module")
def gpu() -> dict:
    return resolved(BASE, GPU)


@pytest.fixture(scope="module")
def local() -> dict:
    return resolved(BASE, LOCAL)


@pytest.mark.parametrize("path", [BASE, GPU, LOCAL], ids=lambda p: p.name)
def test_matches_the_compose_spec_schema(path):
    jsonschema = pytest.importorskip("jsonschema")
    # The schema names draft 2019-09 by an old URL; name the validator instead of looking it up.
    validator = jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))
    errors = [
        f"{'/'.join(map(str, e.path))}: {e.message}"
        for e in validator.iter_errors(yaml.safe_load(path.read_text()))
    ]
    assert not errors, errors


def test_the_plain_file_runs_anywhere(cpu):
    services = cpu["services"]
    assert set(services) == {"ferry", "prometheus", "grafana"}
    for name, service in services.items():
        assert "profiles" not in service, f"{name} must start with a plain `docker compose up`"
        assert "deploy" not in service, f"{name}: a device reservation fails on a host without GPUs"
    build = services["ferry"]["build"]
    assert Path(build["context"]).resolve() == ROOT
    assert (ROOT / build["dockerfile"]).is_file()
    assert build["args"]["VARIANT"] == "cpu" and services["ferry"]["image"] == "ferry:cpu"


def test_the_gpu_file_adds_the_gpu_image_triton_and_vllm(gpu):
    services = gpu["services"]
    assert set(services) == {"ferry", "prometheus", "grafana", "triton", "vllm"}
    assert services["vllm"]["profiles"] == ["vllm"]
    assert services["triton"]["image"].startswith("nvcr.io/nvidia/tritonserver:")
    ferry = services["ferry"]
    assert ferry["build"]["args"]["VARIANT"] == "gpu" and ferry["image"] == "ferry:gpu"
    for name in ("ferry", "triton", "vllm"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices), name
    # Triton's repository is one flavour folder: the repository root holds three.
    models = Path(mounts(services["triton"])["/models"])
    assert (models / "all-MiniLM-L6-v2" / "config.pbtxt").is_file()


def test_the_local_file_builds_every_started_image_from_the_local_base(local):
    services = local["services"]
    for name in ("ferry", "prometheus", "triton"):
        build = services[name]["build"]
        assert build["network"] == "host", name
        base = build["args"].get("PYTHON_IMAGE") or build["args"].get("BASE_IMAGE")
        assert base == "ferry-base:bookworm", name  # tools/docker_base_image.sh's tag
    for name in ("ferry", "triton"):  # the images pip installs into
        assert "EXTRA_CA_CERTS" in services[name]["build"]["args"], name
    # The CPU Triton serves the python-backend flavour, healthy once its model is ready.
    models = Path(mounts(services["triton"])["/models"])
    assert models == ROOT / "triton_models" / "cpu"
    assert "/v2/health/ready" in " ".join(services["triton"]["healthcheck"]["test"])
    triton = (DEPLOY / "triton" / "Dockerfile").read_text()
    assert "COPY bench/triton_env.py" in triton and "triton_env.py --venv /opt/triton" in triton
    dockerfile = Path(services["prometheus"]["build"]["context"]) / "Dockerfile"
    assert "apt-get install" in dockerfile.read_text() and "prometheus" in dockerfile.read_text()
    script = (ROOT / "tools/docker_base_image.sh").read_text()
    assert f'TAG="${{FERRY_BASE_IMAGE:-{base}}}"' in script


def mounts(service: dict) -> dict[str, str]:
    """Target -> source; `config` of docker-compose 1.29 prints the short form src:dst:mode."""
    return {v.split(":")[1]: v.split(":")[0] for v in service.get("volumes", [])}


def _published(config: dict) -> list[int]:
    return [int(p["published"]) for s in config["services"].values() for p in s.get("ports", [])]


def test_host_ports_do_not_clash_and_can_be_moved(gpu):
    ports = _published(gpu)
    assert len(ports) == len(set(ports)), ports
    # Ferry's HTTP port and the KServe v2 gRPC port ferry.toml turns on.
    grpc_port = load_settings(ROOT / "ferry.toml", environ={}).grpc_port
    assert _published({"services": {"ferry": gpu["services"]["ferry"]}}) == [8000, grpc_port]
    # Triton's 8000-8002 are remapped away from Ferry's 8000.
    assert [p["target"] for p in gpu["services"]["triton"]["ports"]] == [8000, 8001, 8002]
    text = BASE.read_text()
    for variable in ("FERRY_HTTP_PORT", "FERRY_GRPC_PORT", "PROMETHEUS_PORT", "GRAFANA_PORT"):
        assert f"${{{variable}:-" in text, variable


def test_bind_mounts_point_at_files_in_the_repository(gpu):
    for name, service in gpu["services"].items():
        for source in mounts(service).values():
            if not source.startswith("/"):
                assert source in gpu["volumes"], f"{name}: undeclared volume {source}"
                continue
            path = Path(source)
            assert path.is_relative_to(ROOT), f"{name}: {path} leaves the repository"
            if name == "vllm":
                # Filled by tools/build_tiny_llm.py; the folder must exist.
                assert path.parent.exists(), f"{name}: {path}"
            else:
                assert path.exists(), f"{name}: {path} does not exist"


def test_prometheus_loads_the_rules_and_waits_for_a_healthy_ferry(cpu):
    prometheus = cpu["services"]["prometheus"]
    mounted = mounts(prometheus)
    assert mounted["/etc/prometheus/prometheus.yml"] == str(DEPLOY / "prometheus/prometheus.yml")
    assert mounted["/etc/prometheus/alerts.yml"] == str(DEPLOY / "prometheus/alerts.yml")
    assert "--storage.tsdb.path=/prometheus" in prometheus["command"]
    assert prometheus["depends_on"]["ferry"]["condition"] == "service_healthy"


def test_stop_grace_period_covers_the_drain(cpu):
    drain = tomllib.loads((ROOT / "ferry.toml").read_text())["server"]["drain_timeout_s"]
    grace = cpu["services"]["ferry"]["stop_grace_period"]
    assert grace.endswith("s") and int(grace[:-1]) > drain


def test_the_schema_check_catches_mistakes():
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))
    broken = {"services": {"ferry": {"image": "x", "deploy": {"resources": {"reservation": {}}}}}}
    assert list(validator.iter_errors(broken))
