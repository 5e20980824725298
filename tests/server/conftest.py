from __future__ import annotations

import pytest
import pytest_asyncio

from ferry.bench.server_process import default_model_config
from ferry.server.metrics import FerryMetrics
from ferry.server.model_runtime import ModelRuntime
from ferry.server.settings import Settings
from tests.server.kserve_support import kserve_server

# The route suites' servers run in both modes: in-process (1) and API processes in front of an
# engine process (2, server/procs). A module-scoped fixture with these params is started once
# per mode.
API_SERVERS = [pytest.param(1, id="api1"), pytest.param(2, id="api2")]
# In-process only, for suites whose checks are all decided in the API process before the hop
# (parsing, validation, tokenizers, response bounds): `api2` would start a second server to
# re-test the same code. Anything crossing the engine boundary with state (cancellation,
# deadlines, queues, streaming, engine errors, merged metrics, shutdown) keeps API_SERVERS.
IN_PROCESS = [pytest.param(1, id="api1")]


@pytest.fixture(scope="session", params=API_SERVERS)
def kserve(request):
    """One server for the KServe v2 modules (HTTP and gRPC share its models and metrics)."""
    with kserve_server(api_servers=request.param) as (handle, grpc_url):
        handle.grpc_url = grpc_url
        yield handle


@pytest_asyncio.fixture(loop_scope="session", scope="session")
async def runtime():
    """The default model started in this process (no server): one ONNX session, small batches
    so calibrating is quick. Shared by the encoder, validation and model_runtime modules."""
    config = default_model_config(backend={"sessions": 1}, batching={"max_batch_size": 4})
    model = ModelRuntime(Settings(models=[config]).models[0], FerryMetrics())
    await model.start()
    yield model
    await model.close(1)
