"""The small JSON file beside every model folder that tells the server how to serve it.

Written at export time so that the server never needs torch or transformers to learn a model's
limits (max length, vocabulary size) or its labels. It lives with the backends, the lowest layer
that reads it: the server reads it through them, and the build-time exporters import it downwards.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

MANIFEST_NAME = "ferry_model.json"

# rerank: a cross-encoder, a sequence classifier with one logit that scores a (query, document)
# pair tokenized together with segment ids.
Task = Literal["embedding", "classification", "rerank"]


@dataclass(frozen=True)
class ModelManifest:
    task: Task
    max_length: int
    vocab_size: int
    pad_token_id: int = 0
    id2label: dict[int, str] = field(default_factory=dict)
    source: str = ""

    def write(self, folder: Path) -> Path:
        path = folder / MANIFEST_NAME
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, folder: Path) -> ModelManifest:
        raw = json.loads((folder / MANIFEST_NAME).read_text())
        raw["id2label"] = {int(k): v for k, v in raw.get("id2label", {}).items()}
        return cls(**raw)
