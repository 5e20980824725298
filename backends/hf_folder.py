"""What the server needs to know of a Hugging Face encoder folder, read from its JSON files.

The torch backend serves such a folder as it is (no export step), so its manifest is derived
here without torch or transformers: the server imports neither unless the backend is chosen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ferry.backends.manifest import MANIFEST_NAME, ModelManifest, Task

CLASSIFICATION_SUFFIX = "ForSequenceClassification"


def folder_task(config: dict[str, Any]) -> Task:
    architectures = config.get("architectures") or []
    if any(a.endswith(CLASSIFICATION_SUFFIX) for a in architectures):
        return "classification"
    return "embedding"


def folder_manifest(folder: Path) -> ModelManifest:
    """ferry_model.json when the folder has one (an export), else derived from config.json."""
    if (folder / MANIFEST_NAME).exists():
        return ModelManifest.read(folder)
    config_path = folder / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{folder}: neither {MANIFEST_NAME} nor a Hugging Face config.json")
    config = json.loads(config_path.read_text())
    task = folder_task(config)
    return ModelManifest(
        task=task,
        max_length=_max_length(folder, config),
        vocab_size=int(config["vocab_size"]),
        pad_token_id=int(config.get("pad_token_id") or 0),
        id2label=(
            {int(k): str(v) for k, v in config.get("id2label", {}).items()}
            if task == "classification"
            else {}
        ),
        source=str(folder),
    )


def _max_length(folder: Path, config: dict[str, Any]) -> int:
    """sentence-transformers' max_seq_length (what the model was trained on), else positions."""
    positions = int(config.get("max_position_embeddings", 512))
    st_config = folder / "sentence_bert_config.json"
    if st_config.exists():
        length = json.loads(st_config.read_text()).get("max_seq_length")
        if length:
            return min(int(length), positions)
    return positions
