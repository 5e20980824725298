"""The docs cannot drift: the references in docs/reference/ are what tools/gen_docs.py makes of
the code today, the site builds with mkdocs --strict (no broken link or anchor), and the README
stays a five-minute read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import gen_docs  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("page", sorted(gen_docs.PAGES))
def test_each_generated_reference_matches_the_code(page):
    written = (gen_docs.REFERENCE / page).read_text()
    assert written == gen_docs.PAGES[page](), f"docs/reference/{page} is stale: run `make docs`"


def test_the_site_builds_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "reference" / "configuration" / "index.html").exists()


def test_the_readme_is_short_and_in_the_newcomers_order():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    order = ["The two commands", "Try it", "Serve your own model", "Deploy", "Documentation"]
    assert [h for h in headings if h in order] == order
    # "Serve your own model" is reachable from the first screen (about 40 lines).
    assert "(#serve-your-own-model)" in "\n".join(text.splitlines()[:40])
