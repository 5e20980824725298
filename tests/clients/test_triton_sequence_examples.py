"""NVIDIA's sequence example clients, unchanged but for the address, against Ferry serving
Triton's simple_sequence and simple_dyna_sequence graphs (and qa's string-CORRID dyna
accumulator): each checks every answer of three interleaved sequences against Triton's, over
HTTP, gRPC and gRPC streaming (sync, callback and asyncio clients); `-d` runs the dyna models
(the oldest strategy, CORRID, END, implicit state)."""

from __future__ import annotations

import pytest

from tests.support.triton_examples import run_example

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
