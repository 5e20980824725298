import json
import re
from pathlib import Path

import pytest

from ferry.backends.manifest import MANIFEST_NAME
from ferry.server.cli import model_argument
from ferry.server.model_files import plain_graph
from ferry.server.settings import ModelSettings

pytestmark = pytest.mark.unit


def settings(path: Path, **fields) -> ModelSettings:
    return ModelSettings(name="m", path=path, **fields)


def test_a_file_is_a_plain_graph_and_a_folder_with_a_manifest_is_not(tmp_path):
    graph = tmp_path / "resnet18.onnx"
    graph.write_bytes(b"")
    assert plain_graph(settings(graph)) == graph
    (tmp_path / MANIFEST_NAME).write_text("{}")
    assert plain_graph(settings(tmp_path)) is None  # an exported encoder
    assert plain_graph(settings(graph, backend={"kind": "torch"})) is None


def test_a_folder_without_a_manifest_serves_its_one_graph(tmp_path):
    (tmp_path / "only.onnx").write_bytes(b"")
    assert plain_graph(settings(tmp_path)) == tmp_path / "only.onnx"
    (tmp_path / "other.onnx").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"2 \.onnx files and no model\.onnx"):
        plain_graph(settings(tmp_path))
    (tmp_path / "model.onnx").write_bytes(b"")
    assert plain_graph(settings(tmp_path)) == tmp_path / "model.onnx"


def test_a_missing_path_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "gone.onnx"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        plain_graph(settings(missing))
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        model_argument(str(missing))


def test_model_arguments_are_named_by_the_stem_unless_named(tmp_path):
    graph = tmp_path / "fraud.v2.onnx"
    graph.write_bytes(b"")
    assert model_argument(str(graph)) == {"name": "fraud.v2", "path": str(graph)}
    assert model_argument(f"scorer={graph}") == {"name": "scorer", "path": str(graph)}
    assert model_argument(str(tmp_path))["name"] == tmp_path.name  # a folder: its name


def test_preprocessing_is_refused_where_it_cannot_apply(tmp_path):
    (tmp_path / MANIFEST_NAME).write_text("{}")  # a token encoder's folder
    graph = tmp_path / "cnn.onnx"
    graph.write_bytes(b"")
    preprocess = {"crop": 224}
    assert plain_graph(settings(graph, preprocess=preprocess)) == graph
    with pytest.raises(ValueError, match="preprocess applies to a plain ONNX graph"):
        plain_graph(settings(tmp_path, preprocess=preprocess))
    with pytest.raises(ValueError, match=r"not to .* on torch"):
        plain_graph(settings(graph, preprocess=preprocess, backend={"kind": "torch"}))


def test_an_image_models_folder_with_its_manifest_is_a_plain_graph(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"")
    manifest = {"task": "image", "preprocess": {"crop": 224}}
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert plain_graph(settings(tmp_path)) == tmp_path / "model.onnx"
