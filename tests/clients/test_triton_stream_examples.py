"""NVIDIA's streaming and sequence example clients, unchanged but for the address, against
Ferry serving Triton's example models (tests/support/triton_example_models.py).

The four sequence clients check every answer of three interleaved sequences against Triton's,
on simple_sequence and simple_dyna_sequence (Triton's own graphs) and qa's string-CORRID dyna
accumulator (implicit state), over HTTP, gRPC and gRPC streaming (sync, callback and asyncio
clients); `-d` runs the dyna models (the oldest strategy, CORRID, END). image_client.py
classifies over a gRPC stream.

Not here: simple_grpc_custom_repeat.py, whose repeat_int32 model is decoupled (several answers
to one request), which Ferry does not serve.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tests.support.triton_examples import run_example

pytestmark = pytest.mark.integration

SEQUENCE_CLIENTS = (
    "simple_http_sequence_sync_infer_client.py",
    "simple_grpc_sequence_sync_infer_client.py",
    "simple_grpc_sequence_stream_infer_client.py",
    "simple_grpc_aio_sequence_stream_infer_client.py",
)


@pytest.mark.parametrize("dyna", [(), ("-d",)], ids=["sequence", "dyna"])
@pytest.mark.parametrize("script", SEQUENCE_CLIENTS)
def test_sequence_example_gets_tritons_answers(triton_models, tmp_path, script, dyna):
    output = run_example(
        script, triton_models.http_address, triton_models.grpc_address, *dyna, tmp=tmp_path
    )
    assert "PASS" in output


def test_image_client_over_a_grpc_stream(triton_models, tmp_path):
    image = tmp_path / "noise.jpg"
    pixels = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(image)
    args = ("-i", "grpc", "--streaming", "-m", "densenet_onnx", "-c", "3", "-s", "INCEPTION")
    output = run_example(
        "image_client.py",
        triton_models.http_address,
        triton_models.grpc_address,
        *args,
        str(image),
        tmp=tmp_path,
    )
    assert output.count("CLASS_") == 3  # its three classes, by the model's labels
