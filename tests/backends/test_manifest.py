"""The model manifest: what an export writes is what the server reads back."""

import json

import pytest

from ferry.backends.manifest import MANIFEST_NAME, ModelManifest

pytestmark = pytest.mark.unit


def test_a_written_manifest_reads_back_equal_with_integer_label_ids(tmp_path):
    manifest = ModelManifest(
        task="classification", max_length=128, vocab_size=1000, id2label={0: "no", 1: "yes"}
    )
    path = manifest.write(tmp_path)
    assert path == tmp_path / MANIFEST_NAME
    # JSON keys are strings: reading turns the label ids back into ints.
    assert json.loads(path.read_text())["id2label"] == {"0": "no", "1": "yes"}
    assert ModelManifest.read(tmp_path) == manifest


def test_optional_fields_default_when_absent(tmp_path):
    (tmp_path / MANIFEST_NAME).write_text(
        json.dumps({"task": "embedding", "max_length": 256, "vocab_size": 30522})
    )
    manifest = ModelManifest.read(tmp_path)
    assert (manifest.pad_token_id, manifest.id2label, manifest.source) == (0, {}, "")
