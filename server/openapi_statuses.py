"""The OpenAPI document lists the invalid-request status each route really answers.

FastAPI documents a 422 on every route that takes a body or parameters. Routes in OpenAI's
dialect answer 400 instead (as OpenAI and vLLM do), and so do KServe v2's (as Triton does), so
for them the 422 entry is removed: a client generated from the document, or a fuzzer checking
answers against it, sees what the server does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ferry.server.dialects import ErrorDialect

FRAMEWORK_INVALID = 422  # FastAPI's status for a request that fails validation


def document_invalid_statuses(
    schema: dict[str, Any], dialect_of: Callable[[str, str], ErrorDialect]
) -> None:
    """Drop the 422 entries of the operations whose dialect (by method and path) never answers
    one."""
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            if dialect_of(method.upper(), path).invalid_status != FRAMEWORK_INVALID:
                operation.get("responses", {}).pop(str(FRAMEWORK_INVALID), None)
