"""Backend failures that concern a whole batch; `server/errors.py` maps them to HTTP."""

from __future__ import annotations

from ferry.batcher.errors import BatchWideFailure


class BackendUnavailable(BatchWideFailure):
    """The backend cannot be reached or is not ready (maps to 503)."""


class BackendTimeout(BatchWideFailure):
    """The backend did not answer in time (maps to 504)."""


class BackendRejected(BatchWideFailure):
    """The backend refused the batch's shape or types (maps to 422)."""
