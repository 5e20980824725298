"""A KServe request header with no parameters is read the quick way (kserve_v2's
`_without_parameters`): each such header must read exactly as the same header with empty
parameters on it, its inputs and its outputs, which the general way reads. Real graphs
(scikit-learn's breast-cancer classifier, ZipMap on), in this process."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from ferry.server.errors import InvalidInput, MalformedRequest
from ferry.server.kserve.lookup import find_model
from ferry.server.routes import kserve_v2
from ferry.server.services import app_services
from ferry.server.settings import Settings
from tests.server.inprocess import serving_app
from tests.support import plain_graphs

pytestmark = pytest.mark.unit

in_module_loop = pytest.mark.asyncio(loop_scope="module")

ROW = {"name": "X", "shape": [1, 30], "datatype": "FP32", "data": [0.5] * 30}
LABEL, PROBABILITY = "output_label", "output_probability"
HEADERS: dict[str, dict[str, Any]] = {
    "inputs only": {"inputs": [ROW]},
    "no outputs named": {"inputs": [ROW], "outputs": []},
    "one output": {"inputs": [ROW], "outputs": [{"name": PROBABILITY}]},
    "both outputs, an id": {
        "id": "r1",
        "inputs": [ROW],
        "outputs": [{"name": PROBABILITY}, {"name": LABEL}],
    },
    "an unknown output": {"inputs": [ROW], "outputs": [{"name": "scores"}]},
    "an output twice": {"inputs": [ROW], "outputs": [{"name": LABEL}, {"name": LABEL}]},
    "an output without a name": {"inputs": [ROW], "outputs": [{"name": None}]},
    "an unknown input": {"inputs": [{**ROW, "name": "Y"}], "outputs": [{"name": LABEL}]},
    "a wrong shape": {"inputs": [{**ROW, "shape": [1, 29]}]},
}

REFUSED = {
    "an unknown output",
    "an output twice",
    "an output without a name",
    "an unknown input",
    "a wrong shape",
}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def reader(tmp_path_factory):
    folder = tmp_path_factory.mktemp("graphs")
    path = plain_graphs.breast_cancer(folder / "lr.onnx", "logistic_regression")
    settings = Settings(models=[{"name": "lr", "path": str(path)}])
    async with serving_app(settings) as (app, _):
        services = app_services(app)
        model = find_model(services.registry, services.encoder, "lr", None)
        regions = services.shared_memory.of(None)
        yield lambda header: kserve_v2.read_request(orjson_bytes(header), None, model, regions)


def orjson_bytes(header: dict[str, Any]) -> bytes:
    import orjson

    return orjson.dumps(header)


def with_empty_parameters(header: dict[str, Any]) -> dict[str, Any]:
    """The same request, every parameters object present and empty: read the general way."""
    return {
        **header,
        "parameters": {},
        "inputs": [{**spec, "parameters": {}} for spec in header["inputs"]],
        **(
            {"outputs": [{**spec, "parameters": {}} for spec in header["outputs"]]}
            if "outputs" in header
            else {}
        ),
    }


def outcome(read, header: dict[str, Any]) -> Any:
    """What reading `header` gives: the request's parts, or the error it raised."""
    try:
        request = read(header)
    except (InvalidInput, MalformedRequest) as error:
        return type(error), str(error), getattr(error, "field", None)
    tensors = {name: (array.dtype, array.tolist()) for name, array in request.tensors.items()}
    return (
        request.wanted,
        request.binary,
        request.classified,
        request.priority,
        request.sequence,
        tensors,
    )


@in_module_loop
@pytest.mark.parametrize("case", HEADERS)
async def test_a_header_without_parameters_reads_as_with_empty_ones(reader, case):
    header = HEADERS[case]
    assert kserve_v2._without_parameters(header)
    general = with_empty_parameters(header)
    assert not kserve_v2._without_parameters(general)
    read = outcome(reader, header)
    assert read == outcome(reader, general)
    refused = read[0] in (InvalidInput, MalformedRequest)
    assert refused == (case in REFUSED), read


@in_module_loop
async def test_parameters_anywhere_take_the_general_way(reader):
    asked = {
        "inputs": [ROW],
        "outputs": [{"name": PROBABILITY, "parameters": {"classification": 2}}],
    }
    read = reader(asked)
    assert set(read.classified) == {PROBABILITY}
    binary = {"inputs": [ROW], "outputs": [{"name": LABEL, "binary_data": True}]}
    assert not kserve_v2._without_parameters(binary)  # a key beside the name
    prioritised = {"inputs": [ROW], "parameters": {"priority": 3}}
    assert reader(prioritised).priority == 3
    assert np.array_equal(reader(prioritised).tensors["X"], reader({"inputs": [ROW]}).tensors["X"])
