from __future__ import annotations

import pytest

from tests.server.kserve_support import kserve_server

# The route suites' servers run in both modes: in-process (1) and API processes in front of an
# engine process (2, server/procs). A module-scoped fixture with these params is started once
# per mode.
API_SERVERS = [pytest.param(1, id="api1"), pytest.param(2, id="api2")]


@pytest.fixture(scope="session", params=API_SERVERS)
def kserve(request):
    """One server for the KServe v2 modules (HTTP and gRPC share its models and metrics)."""
    with kserve_server(api_servers=request.param) as (handle, grpc_url):
        handle.grpc_url = grpc_url
        yield handle
