"""mkdocs hooks (mkdocs.yml `hooks:`): the site's home page is README.md itself, and a page may
link to the code.

- The home page (`index.md`) is README.md, read at build time, so there is no second copy to go
  stale. Its links are written for the repository (`docs/apis.md`, `#try-it`); they are rewritten
  to the site's (`apis.md`).
- Any page may link to a file of the repository outside docs/ the way a repository browser
  resolves it (`[gateway](../server/gateway.py)`). The file is copied into the site under
  `_source/` and the link pointed there, so the link works on the site too, and a link to a file
  that no longer exists fails `mkdocs build --strict` like any broken link. A linked markdown
  file (deploy/README.md) becomes a page outside the nav, its own links treated the same way.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
HOME = "index.md"
SOURCE = "_source"  # where the linked code files go in the site

# A markdown link's target: `](target)` or `](target#anchor)`; a URL or a pure anchor is left be.
_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|#)([^)\s#]+)(#[^)\s]*)?\)")


def _repo_path(page_uri: str) -> str:
    """Where a page's markdown lives in the repository (posix, relative to the root)."""
    if page_uri == HOME:
        return README.name
    code = page_uri.removeprefix(f"{SOURCE}/")
    return code if code != page_uri else f"docs/{page_uri}"


def _rewrite(markdown: str, page_uri: str, docs_dir: str) -> tuple[str, set[str]]:
    """The page's links as the site resolves them, and the code files they point to."""
    here = posixpath.dirname(_repo_path(page_uri))
    site_dir = posixpath.dirname(page_uri)
    code: set[str] = set()

    def relink(match: re.Match[str]) -> str:
        target = posixpath.normpath(posixpath.join(here, match[1]))
        if target == "." or target.startswith("../"):
            return match[0]  # outside the repository: mkdocs reports it
        if target == docs_dir or target.startswith(docs_dir + "/"):
            in_site = posixpath.relpath(target, docs_dir)
        elif (REPO / target).is_file():
            code.add(target)
            in_site = f"{SOURCE}/{target}"
        else:
            return match[0]  # a missing file: mkdocs reports it
        return f"]({posixpath.relpath(in_site, site_dir or '.')}{match[2] or ''})"

    return _LINK.sub(relink, markdown), code


def on_files(files: Files, config: Any) -> Files:
    docs_dir = Path(config.docs_dir).resolve().relative_to(REPO).as_posix()
    if files.get_file_from_path(HOME) is not None:
        raise ValueError(f"{docs_dir}/{HOME} must not exist: the home page is README.md")
    files.append(File.generated(config, HOME, content=README.read_text()))
    pages = [(page.src_uri, page.content_string) for page in files.documentation_pages()]
    copied: set[str] = set()
    while pages:
        uri, markdown = pages.pop()
        for target in sorted(_rewrite(markdown, uri, docs_dir)[1] - copied):
            copied.add(target)
            path = REPO / target
            copy = File.generated(
                config,
                f"{SOURCE}/{target}",
                abs_src_path=str(path),
                inclusion=InclusionLevel.NOT_IN_NAV,
            )
            files.append(copy)
            if copy.is_documentation_page():
                pages.append((copy.src_uri, path.read_text()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    docs_dir = Path(config.docs_dir).resolve().relative_to(REPO).as_posix()
    return _rewrite(markdown, page.file.src_uri, docs_dir)[0]
