from __future__ import annotations

import pytest

from tests.server.kserve_support import kserve_server


@pytest.fixture(scope="session")
def kserve():
    """One server for the KServe v2 modules (HTTP and gRPC share its models and metrics)."""
    with kserve_server() as (handle, grpc_url):
        handle.grpc_url = grpc_url
        yield handle
