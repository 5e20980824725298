"""Python sources parsed for tests that read the code's structure."""

from __future__ import annotations

import ast
from pathlib import Path


def parsed(source: Path | str | bytes) -> ast.Module:
    """`source` (a file, or its text) as a syntax tree. CPython 3.11.7's AST constructor can
    raise a spurious "recursion depth mismatch" SystemError when threads of the process build
    trees at once (python/cpython#106905, fixed in later releases; seen once in this suite under
    load): the same parse again is then correct."""
    text = source.read_text() if isinstance(source, Path) else source
    try:
        return ast.parse(text)
    except SystemError:
        return ast.parse(text)
