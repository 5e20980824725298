"""Every Ferry config the repository shows a user loads: ferry.toml, the Kubernetes ConfigMap's,
and each TOML example in the READMEs and docs/ (one that drifts from the settings model fails)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ferry.server.settings import Settings, load_settings

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCS = tuple(str(page.relative_to(ROOT)) for page in sorted((ROOT / "docs").rglob("*.md")))
READMES = ("README.md", "deploy/README.md", "triton_models/README.md", *DOCS)


def readme_examples() -> list[tuple[str, str]]:
    examples = []
    for readme in READMES:
        text = (ROOT / readme).read_text()
        for number, block in enumerate(re.findall(r"```toml\n(.*?)```", text, re.DOTALL)):
            examples.append((f"{readme}#{number}", block))
    return examples


def load(tmp_path: Path, text: str) -> Settings:
    (tmp_path / "ferry.toml").write_text(text)
    return load_settings(tmp_path / "ferry.toml", environ={})


def test_the_default_config_serves_an_encoder_and_an_llm():
    settings = load_settings(ROOT / "ferry.toml", environ={})
    assert [m.name for m in settings.models] == ["all-MiniLM-L6-v2"]
    assert [m.name for m in settings.llm_models] == ["SmolLM2-135M-Instruct", "tiny-llm"]
    assert (ROOT / settings.llm_models[0].path).name == "SmolLM2-135M-Instruct"
    # One LoRA adapter is served under its own name (vLLM's --lora-modules), on the tiny model.
    assert {k: v.name for k, v in settings.llm_models[1].adapters.items()} == {
        "zen": "zen.onnx_adapter"
    }
    assert all(path.exists() for path in settings.llm_models[1].adapters.values())
    assert (ROOT / settings.models[0].path).name == "all-MiniLM-L6-v2"


def test_the_config_map_loads(tmp_path):
    (configmap,) = yaml.safe_load_all((ROOT / "deploy/k8s/configmap.yaml").read_text())
    settings = load(tmp_path, configmap["data"]["ferry.toml"])
    assert settings.models and settings.llm_models


@pytest.mark.parametrize(("where", "example"), readme_examples(), ids=lambda v: v[:30])
def test_each_readme_example_loads(tmp_path, where, example):
    settings = load(tmp_path, example)
    assert settings.models or settings.llm_models, f"{where} configures no model"


def test_there_are_readme_examples_of_both_model_kinds():
    examples = "".join(block for _, block in readme_examples())
    assert "[[models]]" in examples and "[[llm_models]]" in examples
    assert "[models.backend]" in examples and "[models.batching]" in examples
