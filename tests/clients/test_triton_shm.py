"""System shared memory with Triton's own clients against a real Ferry, in both layouts (one
process; api_servers = 2, where a region registered through one API process is used through
another): NVIDIA's four system shared memory examples unchanged, a 602 KB image by
tritonclient over HTTP and gRPC, and bad regions and CUDA shared memory refused over gRPC."""

from __future__ import annotations

import base64
import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from ferry.bench.shm import IMAGE_BYTES, MODEL, SHAPE, image, image_mean
from tests.server.conftest import API_SERVERS
from tests.support.triton_example_models import model_configs, write_models
from tests.support.triton_examples import run_example

pytestmark = pytest.mark.integration

EXAMPLES = (
    "simple_http_shm_client.py",
    "simple_grpc_shm_client.py",
    "simple_http_shm_string_client.py",
    "simple_grpc_shm_string_client.py",
)


@pytest.fixture(scope="module", params=API_SERVERS)
def server(tmp_path_factory, request):
    from ferry.bench.processes import free_port
    from ferry.bench.server_process import ferry_server

    folder = tmp_path_factory.mktemp("shm_models")
    configs = model_configs(write_models(folder, ("simple", "simple_string")))
    path = image_mean(folder / f"{MODEL}.onnx")
    configs.append({"name": MODEL, "path": str(path), "backend": {"kind": "onnxruntime"}})
    grpc_port = free_port()
    options = {"grpc_port": grpc_port, "api_servers": request.param, "allow_client_shm": True}
    with ferry_server(configs, options, ready_timeout_s=120) as handle:
        handle.http_address = handle.url.removeprefix("http://")
        handle.grpc_address = f"127.0.0.1:{grpc_port}"
        yield handle


@pytest.mark.parametrize("script", EXAMPLES)
def test_nvidia_example(server, script, tmp_path):
    output = run_example(script, server.http_address, server.grpc_address, tmp=tmp_path)
    assert "PASS: system shared memory" in output


@pytest.fixture
def image_regions():
    """A client's input (the image) and output regions, keys of this process's own."""
    tag = f"ferry_it_{os.getpid()}"
    handles = (
        shm.create_shared_memory_region(f"{tag}_in", f"/{tag}_in", IMAGE_BYTES),
        shm.create_shared_memory_region(f"{tag}_out", f"/{tag}_out", 12),
    )
    shm.set_shared_memory_region(handles[0], [image()])
    yield tag, handles
    for handle in handles:
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_image_by_shared_memory(server, image_regions, protocol):
    """Registered, used and unregistered over fresh connections: with api_servers = 2 the
    calls land on either API process."""
    tag, (_, output) = image_regions
    module = grpcclient if protocol == "grpc" else httpclient
    address = server.grpc_address if protocol == "grpc" else server.http_address

    def client():
        return module.InferenceServerClient(address)

    client().register_system_shared_memory("in", f"/{tag}_in", IMAGE_BYTES)
    client().register_system_shared_memory("out", f"/{tag}_out", 12)
    try:
        for _ in range(4):
            tensor = module.InferInput("input", SHAPE, "FP32")
            tensor.set_shared_memory("in", IMAGE_BYTES)
            wanted = module.InferRequestedOutput("mean")
            wanted.set_shared_memory("out", 12)
            result = client().infer(MODEL, [tensor], outputs=[wanted])
            entry = result.get_output("mean")
            assert list(entry["shape"] if protocol == "http" else entry.shape) == [1, 3]
            answer = shm.get_contents_as_numpy(output, np.float32, [1, 3])
            np.testing.assert_allclose(answer, image().mean(axis=(2, 3)), rtol=1e-5)
    finally:
        client().unregister_system_shared_memory()
    status = client().get_system_shared_memory_status()
    assert not (status.regions if protocol == "grpc" else status)


def test_grpc_refusals(server, image_regions):
    tag, _ = image_regions
    client = grpcclient.InferenceServerClient(server.grpc_address)
    client.register_system_shared_memory("in", f"/{tag}_in", IMAGE_BYTES)
    try:
        tensor = grpcclient.InferInput("input", SHAPE, "FP32")
        tensor.set_shared_memory("in", IMAGE_BYTES, offset=4)
        with pytest.raises(InferenceServerException, match=r"INVALID_ARGUMENT.*past the end"):
            client.infer(MODEL, [tensor])
        tensor.set_shared_memory("gone", IMAGE_BYTES)
        with pytest.raises(InferenceServerException, match="'gone' is not registered"):
            client.infer(MODEL, [tensor])
        with pytest.raises(InferenceServerException, match="already"):
            client.register_system_shared_memory("in", f"/{tag}_in", 8)
        with pytest.raises(InferenceServerException, match=r"UNIMPLEMENTED.*CUDA"):
            client.register_cuda_shared_memory("gpu", base64.b64encode(b"handle"), 0, 8)
    finally:
        client.unregister_system_shared_memory("in")
