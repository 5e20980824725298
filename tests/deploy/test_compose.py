"""deploy/docker-compose.yml, checked without a Docker engine.

The file is validated against the Compose Specification JSON schema (schemas/compose-spec.json,
vendored from docker-compose 1.29.2's compose/config/compose_spec.json, Apache-2.0), then its
cross-references: files it mounts exist, ports do not clash, GPUs are reserved.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.deploy_support import DEPLOY, ROOT

COMPOSE = DEPLOY / "docker-compose.yml"
SCHEMA = Path(__file__).parent / "schemas" / "compose-spec.json"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_matches_the_compose_spec_schema(compose):
    jsonschema = pytest.importorskip("jsonschema")
    # The schema names draft 2019-09 by an old URL; name the validator instead of looking it up.
    validator = jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors, errors


def test_docker_compose_config_accepts_it():
    # tools/install_prometheus.sh (run by `make test`) installs Debian's docker-compose.
    result = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr


def test_services(compose):
    services = compose["services"]
    assert set(services) == {"ferry", "triton", "vllm", "prometheus", "grafana"}
    assert services["vllm"]["profiles"] == ["vllm"]
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        if name != "vllm":
            assert "profiles" not in service, f"{name} must start with a plain `docker compose up`"
    assert services["triton"]["image"].startswith("nvcr.io/nvidia/tritonserver:")


def test_ferry_builds_the_gpu_image_from_the_repository(compose):
    build = compose["services"]["ferry"]["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert context == ROOT
    assert (context / build["dockerfile"]).is_file()
    assert build["args"]["VARIANT"] == "gpu"


@pytest.mark.parametrize("name", ["ferry", "triton", "vllm"])
def test_gpu_reserved(compose, name):
    devices = compose["services"][name]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)


def _host_ports(service: dict) -> list[int]:
    return [int(str(p).split(":")[0]) for p in service.get("ports", [])]


def test_host_ports_do_not_clash(compose):
    ports = [p for s in compose["services"].values() for p in _host_ports(s)]
    assert len(ports) == len(set(ports)), ports
    assert _host_ports(compose["services"]["ferry"]) == [8000]
    # Triton's 8000-8002 are remapped away from Ferry's 8000.
    triton = [str(p) for p in compose["services"]["triton"]["ports"]]
    assert [p.split(":")[1] for p in triton] == ["8000", "8001", "8002"]


def test_bind_mounts_point_at_files_in_the_repository(compose):
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                path = (DEPLOY / source).resolve()
                assert path.is_relative_to(ROOT), f"{name}: {source} leaves the repository"
                if name == "triton" or name == "vllm":
                    # Filled by the exporters / tools/build_tiny_llm.py; the folder must exist.
                    assert path.parent.exists(), f"{name}: {source}"
                else:
                    assert path.exists(), f"{name}: {source} does not exist"
            else:
                assert source in compose.get("volumes", {}), f"{name}: undeclared volume {source}"


def test_prometheus_mounts_the_config_and_rules_it_loads(compose):
    volumes = compose["services"]["prometheus"]["volumes"]
    assert "./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in volumes
    assert "./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in volumes


def test_stop_grace_period_covers_the_drain(compose):
    import tomllib

    drain = tomllib.loads((ROOT / "ferry.toml").read_text())["server"]["drain_timeout_s"]
    grace = compose["services"]["ferry"]["stop_grace_period"]
    assert grace.endswith("s") and int(grace[:-1]) > drain


def test_the_schema_check_catches_mistakes():
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))
    broken = {"services": {"ferry": {"image": "x", "deploy": {"resources": {"reservation": {}}}}}}
    assert list(validator.iter_errors(broken))
