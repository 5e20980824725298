"""NVIDIA's Triton client examples (tests/clients/triton_examples/) run unchanged against Ferry
serving Triton's example models, as a user migrating from Triton would: only the address
differs. Each must exit 0, print no error and, where it says so, PASS.

Not here: the shared-memory, streaming, sequence and model-control examples (their own
modules), and the CUDA shared-memory ones (a GPU).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support.triton_examples import run_example

pytestmark = pytest.mark.integration

IMAGE = "{image}"  # the image file's path, filled in by the test
CLASSIFY = ("-m", "densenet_onnx", "-c", "3", "-s", "INCEPTION", IMAGE)

HTTP_EXAMPLES = [
    ("simple_http_infer_client.py",),
    ("simple_http_infer_client.py", "--request-compression-algorithm", "gzip",
     "--response-compression-algorithm", "gzip"),
    ("simple_http_infer_client.py", "--request-compression-algorithm", "deflate",
     "--response-compression-algorithm", "deflate"),
    ("simple_http_async_infer_client.py",),
    ("simple_http_aio_infer_client.py",),
    ("simple_http_aio_infer_client.py", "--request-compression-algorithm", "gzip",
     "--response-compression-algorithm", "deflate"),
    ("simple_http_health_metadata.py",),
    ("simple_http_string_infer_client.py",),
    ("image_client.py", *CLASSIFY),
    ("image_client.py", "-b", "1", *CLASSIFY),
    ("ensemble_image_client.py", "-c", "2", IMAGE),
    ("memory_growth_test.py", "-r", "10"),
]  # fmt: skip
GRPC_EXAMPLES = [
    ("simple_grpc_infer_client.py",),
    ("simple_grpc_infer_client.py", "--grpc-compression-algorithm", "gzip"),
    ("simple_grpc_async_infer_client.py",),
    ("simple_grpc_aio_infer_client.py",),
    ("simple_grpc_health_metadata.py",),
    ("simple_grpc_string_infer_client.py",),
    ("simple_grpc_custom_args_client.py",),
    ("simple_grpc_keepalive_client.py",),
    ("grpc_explicit_int_content_client.py",),
    ("grpc_explicit_int8_content_client.py",),  # its last check: a version that is not served
    ("grpc_explicit_byte_content_client.py",),
    ("grpc_client.py",),
    ("grpc_image_client.py", *CLASSIFY),
    ("image_client.py", "-i", "grpc", *CLASSIFY),
    ("ensemble_image_client.py", "-i", "grpc", "-c", "2", IMAGE),
    ("memory_growth_test.py", "-i", "grpc", "-r", "10"),
]  # fmt: skip


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("images") / "noise.jpg"
    pixels = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


@pytest.mark.parametrize(
    "example", [*HTTP_EXAMPLES, *GRPC_EXAMPLES], ids=lambda e: " ".join(e).replace(IMAGE, "img")
)
def test_example_passes_unchanged(triton_models, image, tmp_path, example):
    script, *args = example
    args = [str(image) if a == IMAGE else a for a in args]
    run_example(script, triton_models.http_address, triton_models.grpc_address, *args, tmp=tmp_path)
