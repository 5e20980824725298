from __future__ import annotations

import pytest
import pytest_asyncio

from ferry.bench.server_process import default_model_config
from ferry.server.metrics import FerryMetrics
from ferry.server.model_runtime import ModelRuntime
from ferry.server.settings import Settings
from tests.server.kserve_support import kserve_server


@pytest.fixture(scope="session")
def kserve():
    """One server for the KServe v2 modules (HTTP and gRPC share its models and metrics)."""
    with kserve_server() as (handle, grpc_url):
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
