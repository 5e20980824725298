"""What a benchmark points at: a URL, the protocol its requests follow, and the model name.

Two request shapes cover every server the benchmarks compare:
- `predict`: Ferry's `POST /predict` with `{"input_ids": [...]}` (the unbatched FastAPI peer
  speaks it too, so does any /predict-compatible server);
- `kserve`: KServe v2 / Open Inference Protocol `POST /v2/models/<model>/infer` with INT64
  `input_ids` and `attention_mask` tensors in JSON, as Triton and Ferry's v2 route accept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

Protocol = Literal["predict", "kserve"]
PROTOCOLS: tuple[Protocol, ...] = ("predict", "kserve")
# Only the pooled embedding: asking Triton for every output would also send back
# last_hidden_state (seq x 384 floats as JSON), and the benchmark would measure JSON encoding.
KSERVE_OUTPUT = "sentence_embedding"


@dataclass(frozen=True)
class Target:
    url: str  # scheme://host:port, optionally with a path that overrides the protocol's
    protocol: Protocol = "predict"
    model: str | None = None  # required for kserve; optional `model` field for predict

    def __post_init__(self) -> None:
        if self.protocol == "kserve" and not self.model:
            raise ValueError("a KServe v2 target needs a model name")
        parts = urlsplit(self.url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"expected an http://host:port URL, got {self.url!r}")

    @property
    def base_url(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def path(self) -> str:
        given = urlsplit(self.url).path
        if given not in ("", "/"):
            return given
        return f"/v2/models/{self.model}/infer" if self.protocol == "kserve" else "/predict"

    def bodies(self, inputs: list[list[int]]) -> list[dict]:
        if self.protocol == "kserve":
            return [kserve_body(ids) for ids in inputs]
        return [predict_body(ids, self.model) for ids in inputs]


def predict_body(ids: list[int], model: str | None = None) -> dict:
    body: dict = {"input_ids": ids}
    if model:
        body["model"] = model
    return body


def kserve_body(ids: list[int], output: str = KSERVE_OUTPUT) -> dict:
    shape = [1, len(ids)]
    return {
        "inputs": [
            {"name": "input_ids", "shape": shape, "datatype": "INT64", "data": ids},
            {"name": "attention_mask", "shape": shape, "datatype": "INT64", "data": [1] * len(ids)},
        ],
        "outputs": [{"name": output}],
    }
