"""The import layout: each top-level package folder is `ferry.<folder>` through a symlink."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOT_SHIPPED = {"tests", "tools", "ferry"}


def test_every_top_level_package_is_linked_into_ferry():
    folders = [p for p in REPO.iterdir() if (p / "__init__.py").is_file()]
    packages = {p.name for p in folders if p.name not in NOT_SHIPPED}
    links = {p.name: p for p in (REPO / "ferry").iterdir() if p.is_symlink()}
    assert set(links) == packages
    for name, link in links.items():
        # Relative, so a copy of the checkout (Docker's build context) keeps working.
        assert str(link.readlink()) == f"../{name}"
