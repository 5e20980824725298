"""A load's `parameters.config` applied to a repository entry: Ferry's fields and Triton's
mapped ones, overrides starting again from the entry, and every refusal naming its field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ferry.server.errors import LoadRefused
from ferry.server.model_overrides import entry_from_json, entry_json, with_config
from ferry.server.settings import LLMSettings, ModelSettings, Settings

pytestmark = pytest.mark.unit

GRAPH = ModelSettings(name="g", path=Path("/models/g.onnx"), batching={"max_batch_size": 8})
LLM = LLMSettings(name="chat", path=Path("/models/chat"))


def test_no_config_is_the_entry():
    assert with_config(GRAPH, None) is GRAPH


def test_triton_fields_map_onto_ferry_settings():
    config = {
        "name": "g",
        "max_batch_size": "16",  # protobuf JSON writes int64 as a string
        "dynamic_batching": {
            "max_queue_delay_microseconds": 500,
            "default_queue_policy": {
                "default_timeout_microseconds": 2_000_000,
                "max_queue_size": 7,
                "timeout_action": "REJECT",
            },
        },
        "instance_group": [{"name": "g", "kind": "KIND_CPU", "count": 3}],
        "platform": "onnxruntime_onnx",
        "backend": "onnxruntime",
        "version_policy": {"latest": {"num_versions": 1}},
    }
    loaded = with_config(GRAPH, json.dumps(config))
    assert loaded.batching.max_batch_size == 16
    assert loaded.batching.max_queue_delay_s == 0.0005
    assert loaded.batching.max_queue_size == 7
    assert loaded.timeout_s == 2.0
    assert (loaded.backend.device, loaded.backend.sessions) == ("cpu", 3)  # type: ignore[union-attr]
    assert loaded.path == GRAPH.path


def test_ferry_fields_merge_into_the_entrys_tables():
    loaded = with_config(GRAPH, json.dumps({"batching": {"max_queue_size": 3}, "timeout_s": 5}))
    assert (loaded.batching.max_batch_size, loaded.batching.max_queue_size) == (8, 3)
    assert loaded.timeout_s == 5
    assert with_config(LLM, '{"max_running": 2}').options.max_running == 2  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("entry", "config", "field"),
    [
        (GRAPH, "{{", "parameters.config"),
        (GRAPH, "[]", "parameters.config"),
        (GRAPH, '{"name": "other"}', "parameters.config.name"),
        (GRAPH, '{"path": "/etc"}', "parameters.config.path"),
        (GRAPH, '{"max_batch_size": 0}', "parameters.config.max_batch_size"),
        (GRAPH, '{"max_batch_size": true}', "parameters.config.max_batch_size"),
        (GRAPH, '{"input": []}', "parameters.config.input"),
        (GRAPH, '{"backend": "tensorrt"}', "parameters.config.backend"),
        (GRAPH, '{"sequence_batching": {}}', "parameters.config.sequence_batching"),
        (
            GRAPH,
            '{"dynamic_batching": {"preferred_batch_size": [4]}}',
            "parameters.config.dynamic_batching.preferred_batch_size",
        ),
        (GRAPH, '{"instance_group": [{}, {}]}', "parameters.config.instance_group"),
        (GRAPH, '{"timeout_s": -1}', "parameters.config.timeout_s"),
        (LLM, '{"max_batch_size": 4}', "parameters.config.max_batch_size"),
        (LLM, '{"max_running": 0}', "parameters.config.max_running"),
        (LLM, '{"gpu_memory_utilization": 0.5}', "parameters.config.gpu_memory_utilization"),
    ],
)
def test_refusals_name_the_field(entry, config, field):
    with pytest.raises(LoadRefused) as refused:
        with_config(entry, config)
    assert refused.value.field == field
    assert refused.value.message.startswith(f"failed to load '{entry.name}': ")


def test_entries_cross_processes_as_json():
    configured = Settings(
        models=[{"name": "e", "path": "/m", "batching": {"max_batch_size": 4}}],
        llm_models=[{"name": "l", "path": "/l", "max_running": 2}],
    )
    for entry in (*configured.models, *configured.llm_models, GRAPH, LLM):
        assert entry_from_json(entry_json(entry)) == entry
