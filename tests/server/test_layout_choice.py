"""The layout chosen from the models and the host when the configuration names none."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ferry.server.layout_choice import (
    MIN_CORES,
    REPLICA_MODEL_BYTES,
    Host,
    apply_layout,
    choose_layout,
)
from ferry.server.settings import load_settings
from tests.support import plain_graphs

pytestmark = pytest.mark.unit

CPU, GPU = Host(cores=8, gpu=False), Host(cores=16, gpu=True)


@pytest.fixture
def small_model(tmp_path: Path) -> dict:
    path = tmp_path / "tiny.onnx"
    path.write_bytes(bytes(1000))
    return {"name": "tiny", "path": str(path)}


@pytest.fixture
def large_model(tmp_path: Path) -> dict:
    path = tmp_path / "large"
    path.mkdir()
    with (path / "model.onnx").open("wb") as file:  # sparse: the size is what counts
        file.truncate(REPLICA_MODEL_BYTES + 1)
    return {"name": "large", "path": str(path)}


def settings(models: list[dict], llm_models: tuple = (), environ: dict | None = None, **server):
    from ferry.server.settings import Settings

    loaded = load_settings(environ=environ or {}, extra_models=models, **server)
    if llm_models:
        loaded = Settings(**server, models=loaded.models, llm_models=llm_models)
    return loaded


def counts(chosen) -> tuple[int, int]:
    return chosen.api_servers, chosen.replicas


def test_small_cpu_models_get_replicas_on_half_the_cores(small_model):
    chosen = choose_layout(settings([small_model]), CPU)
    assert counts(chosen) == (1, 4)
    assert "4 whole servers on one port" in chosen.why


def test_a_model_on_the_gpu_gets_the_engine_in_its_own_process(small_model):
    chosen = choose_layout(settings([small_model]), GPU)  # device "auto" on a GPU host
    assert counts(chosen) == (4, 1)
    assert "engine in its own process" in chosen.why
    cuda = {**small_model, "backend": {"kind": "onnxruntime", "device": "cuda"}}
    assert counts(choose_layout(settings([cuda]), CPU)) == (2, 1)


@pytest.mark.parametrize("cores", [1, 2, MIN_CORES - 1])
def test_a_small_host_is_served_by_one_process(small_model, cores):
    chosen = choose_layout(settings([small_model]), Host(cores=cores, gpu=True))
    assert counts(chosen) == (1, 1)
    assert f"{cores} cores" in chosen.why


def test_models_too_large_to_copy_are_held_once(small_model, large_model):
    chosen = choose_layout(settings([small_model, large_model]), CPU)
    assert counts(chosen) == (1, 1)
    assert "MiB of models on the CPU, held once" in chosen.why


def test_llms_on_the_cpu_are_held_once_and_vllm_gets_an_engine_process():
    ortgenai = settings([], llm_models=({"name": "lm", "path": "/lm"},))
    assert counts(choose_layout(ortgenai, CPU)) == (1, 1)
    vllm = settings([], llm_models=({"name": "lm", "path": "/lm", "engine": "vllm"},))
    assert counts(choose_layout(vllm, CPU)) == (2, 1)


def test_what_lives_in_one_process_keeps_one_process(small_model):
    sequences = {**small_model, "sequence_batching": {}}
    assert counts(choose_layout(settings([sequences]), GPU)) == (1, 1)
    explicit = settings([small_model], model_control_mode="explicit", load_models=["tiny"])
    assert counts(choose_layout(explicit, CPU)) == (1, 1)


@pytest.mark.parametrize(
    "given",
    [{"replicas": 1}, {"api_servers": 1}, {"environ": {"FERRY_REPLICAS": "1"}}, {"api_servers": 3}],
)
def test_a_configured_layout_is_kept(small_model, given):
    configured = settings([small_model], **given)
    chosen = choose_layout(configured, CPU)
    assert counts(chosen) == (configured.api_servers, configured.replicas)
    assert "set in the configuration" in chosen.why


@pytest.mark.parametrize("host", [CPU, GPU, Host(cores=2, gpu=False)])
def test_the_chosen_layout_is_one_the_settings_accept(small_model, host):
    configured = settings([small_model])
    chosen = choose_layout(configured, host)
    applied = apply_layout(configured, chosen)
    assert (applied.api_servers, applied.replicas) == counts(chosen)
    settings([small_model], api_servers=chosen.api_servers, replicas=chosen.replicas)


SMALL_HOST = Host(cores=2, gpu=False)


def graph_model(name: str, path: Path, **table) -> dict:
    return {"name": name, "path": str(path), **table}


def test_light_graphs_get_a_replica_per_core_on_a_small_host(tmp_path):
    """Trees and linear models leave the second core idle: the event loop is the limit."""
    trees = plain_graphs.breast_cancer(tmp_path / "gb.onnx", "gradient_boosting")
    models = [graph_model("gb", trees), graph_model("iris", plain_graphs.iris_graph())]
    chosen = choose_layout(settings(models), SMALL_HOST)
    assert counts(chosen) == (1, 2)
    assert "light CPU graphs" in chosen.why
    assert counts(choose_layout(settings(models), Host(cores=1, gpu=False))) == (1, 1)


def test_a_graph_with_a_matrix_product_keeps_a_small_host_to_one_process(tmp_path):
    trees = plain_graphs.breast_cancer(tmp_path / "gb.onnx", "gradient_boosting")
    product = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "product",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")],
    )
    onnx.save(helper.make_model(product), tmp_path / "product.onnx")
    models = [graph_model("gb", trees), graph_model("product", tmp_path / "product.onnx")]
    chosen = choose_layout(settings(models), SMALL_HOST)
    assert counts(chosen) == (1, 1)
    assert "2 cores: one process" in chosen.why
