"""Which tests share a worker when the suite runs on several (`make test`: `pytest -n 2 --dist
loadgroup`). A module stays whole on one worker, so its module-scoped servers start once; the
modules of one session-scoped server (Triton's example models, the KServe suites, the exported
tiny LLMs) go together, so that server starts once too; the Docker modules share one engine and
its image cache, so they run one after another.

The groups are handed out in collection order to whichever worker is free: the modules that
take minutes on their own come first, so that neither worker is left with one at the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _pytest.nodeid import NodeId

# Session-scoped fixtures that start a server or export models: every test using one runs on
# the worker that built it.
SHARED_FIXTURES = (
    "triton_models",
    "kserve",
    "runtime",
    "fp32_exports",
    "tiny_llm_exports",
    "kv_model",
    "reference",
    "triton_repository",
    "traces",
)
DOCKER_MODULES = (
    "tests/deploy/test_apt_install.py",
    "tests/deploy/test_compose.py",
    "tests/deploy/test_docker_stack.py",
    "tests/deploy/test_install_scripts.py",
    "tests/deploy/test_kserve_runtime.py",
)
# Minutes each (`make test` prints the slowest tests): started first.
LONG_FIRST = (
    "tests/server/test_openapi_fuzz.py",
    "tests/exporters/test_llm_export.py",
    "tests/clients/test_lm_eval.py",
    "tests/deploy/test_live_dashboards.py",
    "tests/deploy/test_live_llm_triton.py",
    "tests/server/procs/test_api_servers.py",
)


REPO = Path(__file__).resolve().parents[2]


# A wrapper: the marks must be there before pytest-xdist's own hook reads them, and the group
# checked in each test id after it.
@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Iterator[None]:
    group_for_workers(items, REPO)
    yield
    if getattr(config.option, "loadgroup", False):
        name_groups_in_ids(items)


def name_groups_in_ids(items: list[pytest.Item]) -> None:
    """Ends each test's id with `@group`, where xdist's scheduler reads the group. xdist 3.8
    writes it to `_nodeid`, which pytest 9.2 no longer reads (pytest-xdist#1386): every test was
    then a group of its own, a module's tests went round-robin over both workers, and each
    worker started the module's servers (the Docker stack twice)."""
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        suffix = f"@{mark.args[0]}" if mark else ""
        if suffix and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)  # type: ignore[attr-defined]


def group_for_workers(items: list[pytest.Item], repo: Path) -> None:
    """Marks each test with its module's worker group and puts the long groups first (in place,
    a stable sort: each module's tests stay together and in order)."""
    modules = {id(item): Path(item.fspath).relative_to(repo).as_posix() for item in items}
    used: dict[str, set[str]] = {}
    for item in items:
        used.setdefault(modules[id(item)], set()).update(item.fixturenames)  # type: ignore[attr-defined]
    groups = {module: _group(module, fixtures) for module, fixtures in used.items()}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[modules[id(item)]]))
    first = {groups[module] for module in LONG_FIRST if module in groups}
    items.sort(key=lambda item: groups[modules[id(item)]] not in first)


def _group(module: str, fixtures: set[str]) -> str:
    """A module's group: Docker's, else its first shared fixture's, else its own."""
    if module in DOCKER_MODULES:
        return "docker"
    return next((name for name in SHARED_FIXTURES if name in fixtures), module)
