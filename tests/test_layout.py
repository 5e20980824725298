"""The import layout: each top-level package folder is `ferry.<folder>` through a symlink, and
imports point down the README's list of packages, never up."""

import ast
from pathlib import Path

import pytest

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
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                if parts[0] == "ferry" and len(parts) > 1 and parts[1] != package:
                    found.add((str(path.relative_to(REPO)), parts[1]))
    return found


@pytest.mark.parametrize("package", LAYERS)
def test_imports_point_down(package):
    below = set(LAYERS[LAYERS.index(package) + 1 :])
    upward = [(path, target) for path, target in ferry_imports(package) if target not in below]
    assert not upward, sorted(upward)
