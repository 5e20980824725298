"""NVIDIA's model control examples (simple_http_model_control.py, simple_grpc_model_control.py),
unchanged, against Ferry in Triton's `--model-control-mode=explicit` with nothing loaded at
start, as Triton's qa runs them (L0_http, L0_grpc).

Each counts the repository's models: 7 for the HTTP one, 8 for the gRPC one (their repositories
differ in Triton's qa too). One server serves both: before each, its config file (Ferry's
repository, which an index reads again in explicit mode) is rewritten with that many models."""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from ferry.bench.server_process import write_config
from tests.support.triton_example_models import MODELS, model_configs, triton_server
from tests.support.triton_examples import run_example

pytestmark = pytest.mark.integration

EXPLICIT = {"model_control_mode": "explicit"}
# The script's one check Ferry answers otherwise, on purpose: a file override whose path has a
# part longer than NAME_MAX is client input, INVALID_ARGUMENT (Triton's own TODO in the script,
# TRI-958, says so), where Triton answers INTERNAL.
GRPC_DEVIATION = (
    "FAILED: expected status 'StatusCode.INTERNAL' for oversized file parameter, "
    "got status='StatusCode.INVALID_ARGUMENT'"
)


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("model_control")
    with triton_server(directory, tuple(m.name for m in MODELS), **EXPLICIT) as server:
        server.models = directory  # type: ignore[attr-defined]
        server.config = Path(server.command[server.command.index("--config") + 1])  # type: ignore[attr-defined]
        yield server


def repository_of(server, count: int) -> None:
    """The server's config (its repository) with Triton's first `count` example models."""
    paths = {m.name: server.models / f"{m.name}.onnx" for m in MODELS[:count]}
    port = int(server.grpc_address.rpartition(":")[2])
    write_config(server.config, model_configs(paths), {"grpc_port": port, **EXPLICIT})


def test_http_model_control(explicit_server, tmp_path):
    repository_of(explicit_server, 7)
    output = run_example(
        "simple_http_model_control.py",
        explicit_server.http_address,
        explicit_server.grpc_address,
        tmp=tmp_path,
    )
    assert "PASS: model control" in output


def test_grpc_model_control(explicit_server, tmp_path):
    """Every check up to the oversized file override passes; that one gets a 4xx, not
    Triton's 5xx; the script's last check (a wrong name) is then run here."""
    repository_of(explicit_server, 8)
    with pytest.raises(AssertionError) as failed:
        run_example(
            "simple_grpc_model_control.py",
            explicit_server.http_address,
            explicit_server.grpc_address,
            tmp=tmp_path,
        )
    assert GRPC_DEVIATION in str(failed.value)
    client = grpcclient.InferenceServerClient(explicit_server.grpc_address)
    assert client.is_server_live()
    with pytest.raises(InferenceServerException, match="failed to load 'wrong_model_name'"):
        client.load_model("wrong_model_name")
