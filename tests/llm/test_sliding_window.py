"""What onnxruntime-genai's builder makes of sliding-window models by default is refused, at export
and at start, naming the architecture and why: never a server that is ready and then fails."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ferry.bench.processes import free_port
from ferry.bench.server_process import REPO, write_config
from ferry.exporters import llm_export
from ferry.exporters.genai_builder import builder_args
from ferry.llm.errors import UnservableModel
from ferry.llm.ortgenai import OrtGenAIEngine
from tests.exporters.tiny_llms import MATRIX, SLIDING, build_tiny_llm

pytestmark = pytest.mark.integration

# The builder's default for each: a window-sized ring on Gemma2's sliding layers; a window in
# genai_config.json that no attention applies for a Mistral config without `layer_types`.
REASONS = {
    "Gemma2ForCausalLM": r"gemma2: its sliding-window layers \[0\] keep a 16-token ring",
    "MistralForCausalLM": r"mistral: genai_config.json gives a 16-token sliding window that no",
}


@pytest.fixture(scope="module")
def builder_defaults(tmp_path_factory) -> dict[str, tuple[str, Path, Path]]:
    """Each sliding model built with the builder's own defaults: (architecture, its Hugging Face
    folder, the builder's output), by name; one builder process builds them all."""
    root = tmp_path_factory.mktemp("builder-default")
    jobs, built = [], {}
    for name in SLIDING:
        spec = MATRIX[name]
        hf = build_tiny_llm(spec, root / name / "hf")
        out = root / name / "onnx"
        jobs.append(builder_args(hf, out, "fp32", root / name / "cache", []))
        built[name] = (spec.architecture, hf, out)
    (root / "jobs.json").write_text(json.dumps(jobs))
    command = [sys.executable, "-m", "ferry.exporters.genai_builder"]
    subprocess.run([*command, str(root / "jobs.json"), str(root / "results.json")], check=True)
    assert json.loads((root / "results.json").read_text()) == [None] * len(jobs)
    return built


@pytest.fixture(params=SLIDING)
def builder_default(request, builder_defaults) -> tuple[str, Path, Path]:
    return builder_defaults[request.param]


def test_the_engine_refuses_it(builder_default) -> None:
    arch, _, exported = builder_default
    with pytest.raises(UnservableModel, match=REASONS[arch]):
        OrtGenAIEngine(exported)


def test_the_export_check_refuses_it(builder_default) -> None:
    arch, hf, exported = builder_default
    with pytest.raises(llm_export.UnsupportedArchitecture, match=REASONS[arch]):
        llm_export.check_attention_windows(exported, hf, arch)


def test_the_server_does_not_start_with_it(builder_default, tmp_path: Path) -> None:
    arch, _, exported = builder_default
    model = {"name": "w", "engine": "ortgenai", "path": str(exported)}
    config = write_config(tmp_path / "ferry.toml", [], llm_models=[model])
    command = [sys.executable, "-m", "ferry", "serve", "--config", str(config)]
    command += ["--port", str(free_port()), "--log-level", "warning"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode != 0, run.stderr[-2000:]  # uvicorn: startup failed
    assert re.search(REASONS[arch], run.stderr), run.stderr[-2000:]
    assert "Re-export it with `ferry export llm`" in run.stderr
