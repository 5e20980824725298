"""The docs cannot drift: the references in docs/reference/ are what tools/gen_docs.py makes of
the code today, the site builds with mkdocs --strict (no broken link or anchor, code links
included), its home page is the README itself, and the README stays a five-minute read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import docs_site  # noqa: E402
import gen_docs  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("page", sorted(gen_docs.PAGES))
def test_each_generated_reference_matches_the_code(page):
    written = (gen_docs.REFERENCE / page).read_text()
    assert written == gen_docs.PAGES[page](), f"docs/reference/{page} is stale: run `make docs`"


def test_every_row_of_the_configuration_reference_has_a_description():
    """Each setting's row says what it does: the comment above its field (or after it)."""
    rows = [r for r in gen_docs.configuration().splitlines() if r.startswith("| `")]
    cells = [re.split(r"(?<!\\)\|", row)[1:-1] for row in rows]  # `\|` is a | inside a cell
    empty = [row[0].strip() for row in cells if not row[-1].strip()]
    assert len(rows) > 100 and not empty, f"settings without a description: {empty}"


def test_no_generated_reference_depends_on_the_checkout():
    for render in gen_docs.PAGES.values():
        assert str(REPO) not in render()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for the module with --strict (any warning fails it)."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_site_builds_strict(site):
    for page in ("configuration", "cli", "routes"):
        assert (site / "reference" / page / "index.html").exists()


def test_the_home_page_is_the_readme_with_the_sites_links(site):
    assert not (REPO / "docs" / "index.md").exists(), "the home page is README.md, not a copy"
    home = (site / "index.html").read_text()
    for heading in re.findall(r"^## (.+)$", (REPO / "README.md").read_text(), flags=re.M):
        assert heading in home
    assert 'href="apis/#which-axes-pad-every-answer-is-the-requests-own"' in home
    assert 'href="docs/' not in home


def test_code_links_are_served_with_the_site(site):
    page = (site / "request-path" / "index.html").read_text()
    assert 'href="../_source/server/gateway.py"' in page
    assert (site / "_source" / "server" / "gateway.py").read_bytes() == (
        REPO / "server" / "gateway.py"
    ).read_bytes()


@pytest.mark.parametrize(
    ("page", "link", "site_link"),
    [
        ("index.md", "docs/apis.md#try", "apis.md#try"),  # the README, at the root
        ("index.md", "#try-it", "#try-it"),
        ("index.md", "deploy/README.md", "_source/deploy/README.md"),
        ("apis.md", "../server/hot.py", "_source/server/hot.py"),
        ("reference/cli.md", "../../ferry/cli.py", "../_source/ferry/cli.py"),
        ("reference/cli.md", "../apis.md", "../apis.md"),
        ("_source/deploy/README.md", "../triton_models/README.md", "../triton_models/README.md"),
        ("apis.md", "https://example.com/a.md", "https://example.com/a.md"),
        ("apis.md", "../server/no_such_module.py", "../server/no_such_module.py"),  # mkdocs: 404
    ],
)
def test_links_are_rewritten_for_the_site(page, link, site_link):
    markdown, _ = docs_site._rewrite(f"[x]({link})", page, "docs")
    assert markdown == f"[x]({site_link})"


def test_the_readme_is_short_and_in_the_newcomers_order():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    order = ["The two commands", "Try it", "Serve your own model", "Deploy", "Documentation"]
    assert [h for h in headings if h in order] == order
    # "Serve your own model" is reachable from the first screen (about 40 lines).
    assert "(#serve-your-own-model)" in "\n".join(text.splitlines()[:40])
