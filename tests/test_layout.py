"""The import layout: each top-level package folder is `ferry.<folder>` through a symlink, and
imports point down docs/design.md's list of packages, never up."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.source_trees import parsed

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
NOT_SHIPPED = {"tests", "tools", "ferry"}
# Top to bottom: a package may import only the packages after it (lazily or not).
LAYERS = ("bench", "exporters", "server", "llm", "backends", "batcher")


def test_every_top_level_package_is_linked_into_ferry():
    folders = [p for p in REPO.iterdir() if (p / "__init__.py").is_file()]
    packages = {p.name for p in folders if p.name not in NOT_SHIPPED}
    assert packages == set(LAYERS)
    links = {p.name: p for p in (REPO / "ferry").iterdir() if p.is_symlink()}
    assert set(links) == packages
    for name, link in links.items():
        # Relative, so a copy of the checkout (Docker's build context) keeps working.
        assert str(link.readlink()) == f"../{name}"


def ferry_imports(package: str) -> set[tuple[str, str]]:
    """(importing file, imported ferry package) for every import in one package's files."""
    found = set()
    for path in sorted((REPO / package).rglob("*.py")):
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == "ferry" and len(parts) > 1 and parts[1] != package:
                found.add((str(path.relative_to(REPO)), parts[1]))
    return found


def imported_modules(path: Path) -> list[str]:
    """The absolute module names a file imports."""
    modules = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.append(node.module)
    return modules


@pytest.mark.parametrize("package", LAYERS)
def test_imports_point_down(package):
    below = set(LAYERS[LAYERS.index(package) + 1 :])
    upward = [(path, target) for path, target in ferry_imports(package) if target not in below]
    assert not upward, sorted(upward)


@pytest.mark.parametrize("package", LAYERS)
def test_a_package_has_one_import_name(package):
    # From the repository root the folder is importable on its own: it must refuse, naming ferry.
    done = subprocess.run(
        [sys.executable, "-c", f"import {package}"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert f"ImportError: import ferry.{package}, not {package}" in done.stderr


def python_files() -> list[Path]:
    """The product, tests, bench and tools: every .py file of the checkout, venvs left out."""
    skip = {".git", "build", "artifacts", "node_modules"}
    return [
        path
        for path in REPO.rglob("*.py")
        if not any(part in skip or part.startswith(".venv") for part in path.parts)
        and "ferry" not in path.relative_to(REPO).parts[:1]  # the links: the same files again
    ]


def test_no_file_imports_a_package_by_its_bare_name():
    bare = [
        f"{path.relative_to(REPO)}: {module}"
        for path in python_files()
        for module in imported_modules(path)
        if module.split(".")[0] in LAYERS
    ]
    assert not bare, bare


# Import circles that go through a lazy import inside a function, still to break (issue 47).
KNOWN_CIRCLES = {
    frozenset({"ferry.server.dialects", "ferry.server.route_table"}),
}


def module_imports() -> dict[str, set[str]]:
    """Every shipped module (`ferry.cli`, `ferry.server.app`, ...) and the shipped modules it
    imports, at module level or inside a function."""
    files = {}
    for path in [
        *(REPO / "ferry").glob("*.py"),
        *(p for d in LAYERS for p in (REPO / d).rglob("*.py")),
    ]:
        parts = path.relative_to(REPO).with_suffix("").parts
        parts = parts[1:] if parts[0] == "ferry" else parts
        files["ferry." + ".".join(p for p in parts if p != "__init__")] = path
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        graph[module] = set()
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from ferry.x import y` imports the module ferry.x.y where there is one.
                submodules = [f"{node.module}.{alias.name}" for alias in node.names]
                names = [name for name in submodules if name in files] or [node.module]
            else:
                continue
            graph[module] |= {name for name in names if name in files and name != module}
    return graph


def import_circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The groups of modules that import each other, directly or through others."""
    reach = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for imported in graph[todo.pop()] - seen:
                seen.add(imported)
                todo.append(imported)
        reach[start] = seen
    return {
        frozenset(other for other in reach[module] if module in reach[other])
        for module in graph
        if module in reach[module]
    }


def test_no_modules_import_each_other():
    # A circle works only while one side imports lazily, and a reader cannot tell which module
    # is the lower one (issue 47: exporters/cli.py <-> vision_cli.py).
    circles = import_circles(module_imports())
    assert not circles - KNOWN_CIRCLES, sorted(map(sorted, circles - KNOWN_CIRCLES))


def test_the_ferry_command_loads_the_benchmarks_only_for_ferry_bench():
    top_level = parsed(REPO / "ferry" / "cli.py").body
    imported = [node.module for node in top_level if isinstance(node, ast.ImportFrom)]
    assert imported and not [name for name in imported if name.startswith("ferry.bench")]
