"""Triton's own qa tests of its HTTP front end (tests/clients/triton_qa/, BSD-3), run unchanged
but for the address against Ferry serving Triton's models.

Each case Ferry cannot pass is listed below with why; they are reported as skipped, never run
half-way. The model repository cases belong to that extension's module (issue 44).
"""

from __future__ import annotations

import pytest

from tests.support.triton_examples import run_qa

HTTP_TEST = "L0_http/http_test.py"
AIO_TEST = "L0_http/python_http_aio_test.py"

PASSING = {
    HTTP_TEST: [
        "HttpTest.test_raw_binary",
        "HttpTest.test_raw_binary_longer",
        "HttpTest.test_byte",
        "HttpTest.test_byte_too_many_elements",
        "HttpTest.test_multi_variable_dimensions",
        "HttpTest.test_multi_inputs",
        "HttpTest.test_content_encoding_unsupported_client",
        "HttpTest.test_inference_header_content_length_out_of_range",
        "HttpTest.test_duplicate_output_names",
    ],
    AIO_TEST: [
        "TestHttpAioClient.test_is_server_live",
        "TestHttpAioClient.test_is_server_ready",
        "TestHttpAioClient.test_is_model_ready",
        "TestHttpAioClient.test_get_server_metadata",
        "TestHttpAioClient.test_get_model_metadata",
        "TestHttpAioClient.test_get_model_config",
        "TestHttpAioClient.test_get_inference_statistics",
        "TestHttpAioClient.test_get_trace_settings",
        "TestHttpAioClient.test_update_trace_settings",
    ],
}
NOT_RUN = {
    "HttpTest.test_content_encoding_chunked_manually": (
        "sends Content-Length and Transfer-Encoding: chunked together, which uvicorn refuses "
        "(400) as RFC 9112 allows, against request smuggling; a chunked body without "
        "Content-Length is served"
    ),
    "HttpTest.test_descriptive_status_code": (
        "a full queue is Ferry's 429 with Retry-After (one error table for every API), where "
        "Triton answers 503"
    ),
    "HttpTest.test_buffer_size_overflow": (
        "expects the wording of Triton's C++ 64-bit overflow guards (Python's integers do not "
        "overflow: Ferry answers the same 400, the shape refused as larger than the body)"
    ),
    "HttpTest.test_negative_dimensions": (
        "expects Triton's 500 (its JSON parser's error) for client input; Ferry never answers "
        "a 5xx for client input (400 naming the shape)"
    ),
    "HttpTest.test_json_recursion_depth_limit": (
        "Triton flattens `data` nested up to 100 deep around any shape; Ferry takes the shape's "
        "nesting or a flat list, at most 32 deep (deeper is a 400 in Ferry's words)"
    ),
    "HttpTest.test_loading_large_invalid_model": "the model repository extension",
    "HttpTest.test_load_oversized_file_parameter": "the model repository extension",
    "HttpTest.test_repository_index_deeply_nested_json": "the model repository extension",
    "TestHttpAioClient.test_get_model_repository_index": "the model repository extension",
    "TestHttpAioClient.test_load_model": "the model repository extension",
    "TestHttpAioClient.test_unload_model": "the model repository extension",
    "TestHttpAioClient.test_get_system_shared_memory_status": "the shared memory extension",
    "TestHttpAioClient.test_register_system_shared_memory": "the shared memory extension",
    "TestHttpAioClient.test_unregister_system_shared_memory": "the shared memory extension",
    "TestHttpAioClient.test_get_cuda_shared_memory_status": "the shared memory extension",
    "TestHttpAioClient.test_register_cuda_shared_memory": "the shared memory extension",
    "TestHttpAioClient.test_unregister_cuda_shared_memory": "the shared memory extension",
}


@pytest.mark.parametrize("script", list(PASSING))
def test_tritons_qa_cases_pass(triton_models, tmp_path, script):
    run_qa(
        script,
        triton_models.http_address,
        triton_models.grpc_address,
        PASSING[script],
        tmp=tmp_path,
    )


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.skip(reason=why)) for c, why in NOT_RUN.items()]
)
def test_not_run(case):
    """Listed, with why, so that the report shows each case Ferry does not pass."""
