"""The typed services object: the one way the request path reaches the registry, settings,
metrics, drain and the rest (server/services.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from fastapi import FastAPI

from ferry.server.kserve.shared_memory import LocalRegions
from ferry.server.metrics import FerryMetrics
from ferry.server.services import NotStarted, app_services, build_services
from ferry.server.settings import Settings
from tests.support.source_trees import parsed

pytestmark = pytest.mark.unit

SERVER = Path(__file__).resolve().parents[2] / "server"


def _reads_app_state(node: ast.AST) -> bool:
    """`app.state`, `request.app.state`, `self._app.state`: the framework's untyped state."""
    if not isinstance(node, ast.Attribute) or node.attr != "state":
        return False
    owner = node.value
    named = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
    return named.lstrip("_") == "app"


def test_only_the_services_module_touches_the_apps_untyped_state():
    touching = sorted(
        str(path.relative_to(SERVER))
        for path in SERVER.rglob("*.py")
        if any(_reads_app_state(n) for n in ast.walk(parsed(path)))
    )
    assert touching == ["services.py"]


def test_the_models_read_before_the_lifespan_built_them_are_a_named_error():
    services = build_services(Settings(), FerryMetrics(), LocalRegions())
    assert services.models is None  # what /metrics checks before naming served series
    with pytest.raises(NotStarted):
        _ = services.registry


def test_an_app_not_built_by_create_app_has_no_services():
    app = FastAPI()
    app.state.services = object()
    with pytest.raises(TypeError, match="create_app"):
        app_services(app)
