"""Triton's own qa tests of its HTTP front end (tests/clients/triton_qa/, BSD-3), run unchanged
but for the address against Ferry serving Triton's models.

Each case Ferry cannot pass is listed below with why; they are reported as skipped, never run
half-way. The model repository and shared memory cases run against a server of their own, set
up as L0_http's.
"""

from __future__ import annotations

import pytest

from tests.support.triton_examples import run_qa

pytestmark = pytest.mark.integration

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
    "HttpTest.test_loading_large_invalid_model": (
        "builds a 2.9 GB body (2 GiB base64-encoded, then as JSON: over 10 GB of the client's "
        "memory), beyond what the suite may take; Ferry refuses it 413 by its Content-Length, "
        "before reading it, as 'request body is larger than the 4194304-byte limit' "
        "(max_body_bytes), where the case looks for Triton's 'request JSON size' and "
        "' exceeds the maximum allowed input size'"
    ),
    "HttpTest.test_load_oversized_file_parameter": (
        "expects Triton's 500 ('failed to poll from model repository') for a `file:` parameter "
        "whose name is over NAME_MAX, client input (Triton's TODO TRI-958 says 400); Ferry "
        "never answers a 5xx for client input: 403 with model control off, 400 naming the "
        "parameter in explicit mode (file overrides are refused)"
    ),
}
# Cases run against L0_http's own server: seven models, model control off ("none", Triton's
# default: a load or unload is refused) and clients' system shared memory allowed.
L0_HTTP_SERVER_PASSING = {
    HTTP_TEST: ["HttpTest.test_repository_index_deeply_nested_json"],
    AIO_TEST: [
        "TestHttpAioClient.test_get_model_repository_index",
        "TestHttpAioClient.test_load_model",
        "TestHttpAioClient.test_unload_model",
        "TestHttpAioClient.test_get_system_shared_memory_status",
        "TestHttpAioClient.test_register_system_shared_memory",
        "TestHttpAioClient.test_unregister_system_shared_memory",
        "TestHttpAioClient.test_get_cuda_shared_memory_status",
        "TestHttpAioClient.test_register_cuda_shared_memory",
        "TestHttpAioClient.test_unregister_cuda_shared_memory",
    ],
}
L0_HTTP_MODELS = 7  # what test_get_model_repository_index counts


@pytest.mark.parametrize("script", list(PASSING))
def test_tritons_qa_cases_pass(triton_models, tmp_path, script):
    run_qa(script, triton_models, PASSING[script], tmp=tmp_path)


@pytest.fixture(scope="module")
def l0_http_server(tmp_path_factory):
    """Ferry serving the first seven of Triton's example models as L0_http's server does."""
    from tests.support.triton_example_models import MODELS, triton_server

    names = tuple(m.name for m in MODELS[:L0_HTTP_MODELS])
    with triton_server(tmp_path_factory.mktemp("l0_http"), names, allow_client_shm=True) as handle:
        yield handle


@pytest.mark.parametrize("script", list(L0_HTTP_SERVER_PASSING))
def test_tritons_qa_cases_of_its_own_server_pass(l0_http_server, tmp_path, script):
    run_qa(script, l0_http_server, L0_HTTP_SERVER_PASSING[script], tmp=tmp_path)


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.skip(reason=why)) for c, why in NOT_RUN.items()]
)
def test_not_run(case):
    """Listed, with why, so that the report shows each case Ferry does not pass."""
