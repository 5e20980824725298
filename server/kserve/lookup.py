"""The model a KServe request names, as KServe sees every model (kserve_model.py)."""

from __future__ import annotations

from ferry.server.encoder import EncoderServing
from ferry.server.kserve.kserve_model import GraphView, KServeModel
from ferry.server.kserve.token_graph import TokenGraph
from ferry.server.kserve.versions import check_version
from ferry.server.registry import ModelRegistry


def find_model(
    registry: ModelRegistry, encoder: EncoderServing, name: str, version: str | None
) -> KServeModel:
    """The model `name` at `version`: an unknown model first, then an unknown version."""
    graph = registry.graph(name)  # a plain graph, else an encoder (or refused)
    model: KServeModel
    model = GraphView(graph) if graph is not None else TokenGraph(registry.get(name), encoder)
    check_version(model.name, version)
    return model
