import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from ferry.batcher.policy import BatchLimits
from ferry.server.settings import load_settings

pytestmark = pytest.mark.integration


def write(tmp_path: Path, text: str, name: str = "ferry.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


TOML = """
[server]
port = 9000

[[models]]
name = "all-MiniLM-L6-v2"
path = "models/minilm"

[models.batching]
max_batch_size = 16
"""


def test_file_values_and_relative_model_paths(tmp_path):
    settings = load_settings(write(tmp_path, TOML), environ={})
    assert settings.port == 9000
    assert settings.models[0].path == tmp_path / "models/minilm"
    assert settings.models[0].batching.max_batch_size == 16
    assert settings.models[0].batching.max_batch_tokens == BatchLimits().max_batch_tokens
    assert settings.default_model_name == "all-MiniLM-L6-v2"


def test_environment_overrides_the_file_and_flags_override_both(tmp_path):
    environ = {
        "FERRY_PORT": "9100",
        "FERRY_MAX_BODY_BYTES": "2048",
        "FERRY_MODEL__ALL_MINILM_L6_V2__BATCHING__MAX_BATCH_SIZE": "64",
        "FERRY_MODEL__ALL_MINILM_L6_V2__BACKEND__SESSIONS": "3",
        "FERRY_MODEL__ALL_MINILM_L6_V2__OUTPUTS": "sentence_embedding,last_hidden_state",
    }
    settings = load_settings(write(tmp_path, TOML), environ=environ, host="0.0.0.0")
    assert (settings.port, settings.max_body_bytes, settings.host) == (9100, 2048, "0.0.0.0")
    assert settings.models[0].batching.max_batch_size == 64
    assert settings.models[0].backend.sessions == 3
    assert settings.models[0].outputs == ("sentence_embedding", "last_hidden_state")


def test_yaml_files_work_too(tmp_path):
    path = write(tmp_path, "server:\n  port: 9200\nmodels:\n  - name: m\n    path: /m\n", "f.yaml")
    assert load_settings(path, environ={}).port == 9200


def test_unknown_keys_and_bad_values_are_loud(tmp_path):
    with pytest.raises(ValidationError, match="max_batch_sise"):
        load_settings(write(tmp_path, TOML.replace("max_batch_size", "max_batch_sise")), environ={})
    with pytest.raises(ValidationError, match="max_batch_size"):
        load_settings(
            write(tmp_path, TOML),
            environ={"FERRY_MODEL__ALL_MINILM_L6_V2__BATCHING__MAX_BATCH_SIZE": "0"},
        )


def test_config_path_comes_from_the_environment_when_not_given(tmp_path):
    path = write(tmp_path, TOML)
    assert load_settings(environ={"FERRY_CONFIG": str(path)}).port == 9000


LORA_TOML = """
[[llm_models]]
name = "base"
path = "llm"
adapter_dir = "loras"
max_adapters = 2
adapters = { sales = "loras/sales.onnx_adapter", support = "/abs/support.onnx_adapter" }
"""


def test_llm_adapters_with_paths_relative_to_the_file(tmp_path):
    config = tmp_path / "ferry.toml"
    config.write_text(LORA_TOML)
    llm = load_settings(config, environ={}).llm_models[0]
    assert llm.adapters == {
        "sales": tmp_path / "loras" / "sales.onnx_adapter",
        "support": Path("/abs/support.onnx_adapter"),
    }
    assert llm.adapter_dir == tmp_path / "loras"
    assert llm.max_adapters == 2


@pytest.mark.parametrize(
    "change",
    [
        ("max_adapters = 2", "max_adapters = 1"),  # more adapters than may be loaded
        ('name = "base"', 'name = "sales"'),  # an adapter named like a model
        ("sales =", '"sa les" ='),  # not a servable name
    ],
)
def test_bad_adapter_settings_are_loud(tmp_path, change):
    config = tmp_path / "ferry.toml"
    config.write_text(LORA_TOML.replace(*change))
    with pytest.raises(ValidationError):
        load_settings(config, environ={})


BACKENDS = """
[[models]]
name = "ort"
path = "/m"
[models.backend]
kind = "onnxruntime"
sessions = 2

[[models]]
name = "remote"
path = "/m"
[models.backend]
kind = "triton"
url = "triton:8001"
concurrency = 4
"""


def test_each_backend_kind_takes_only_its_own_options(tmp_path):
    ort, remote = load_settings(write(tmp_path, BACKENDS), environ={}).models
    assert (ort.backend.kind, ort.backend.sessions) == ("onnxruntime", 2)
    assert (remote.backend.kind, remote.backend.url, remote.backend.concurrency) == (
        "triton",
        "triton:8001",
        4,
    )
    with pytest.raises(ValidationError, match="sessions"):  # an ONNX Runtime option on Triton
        load_settings(write(tmp_path, BACKENDS.replace("concurrency", "sessions")), environ={})
    with pytest.raises(ValidationError, match="kind"):
        load_settings(write(tmp_path, BACKENDS.replace('"triton"', '"tensorflow"')), environ={})


def test_the_defaults_are_the_batchers_and_concurrency_is_the_backends(tmp_path):
    (model,) = load_settings(write(tmp_path, TOML.replace("max_batch_size = 16", "")), {}).models
    assert model.batching == BatchLimits()
    assert model.backend.kind == "onnxruntime"
    with pytest.raises(ValidationError, match=r"backend\.sessions"):
        load_settings(
            write(tmp_path, TOML.replace("max_batch_size", "max_concurrent_batches")), environ={}
        )
    for given, window in (('"none"', None), ("0", 0.0), ("0.25", 0.25)):
        off = TOML.replace("max_batch_size = 16", f"fairness_window = {given}")
        (model,) = load_settings(write(tmp_path, off), environ={}).models
        assert model.batching.fairness_window == window
    with pytest.raises(ValidationError, match="prepared_batches"):
        load_settings(write(tmp_path, TOML.replace("max_batch_size", "prepared_batches")), {})
    for bad in ("max_batch_tokens = 0", "latency_objective_s = 0.0", "max_queue_delay_s = -1.0"):
        with pytest.raises(ValidationError, match=bad.split(" =")[0]):
            load_settings(write(tmp_path, TOML.replace("max_batch_size = 16", bad)), environ={})


def test_api_keys_name_tenants_and_priority_keys_must_name_one_of_them():
    environ = {"FERRY_API_KEYS": "alice=k1,bob=k2", "FERRY_PRIORITY_KEYS": "bob"}
    settings = load_settings(environ=environ, api_key="k0")
    assert settings.tenant_keys == {"alice": "k1", "bob": "k2", "default": "k0"}
    assert settings.priority_keys == ("bob",) and settings.priority_below_default == "refuse"
    for bad, named in (
        ({"FERRY_PRIORITY_KEYS": "carol"}, "priority_keys names no configured key"),
        ({"FERRY_ADAPTER_KEYS": "carol"}, "adapter_keys names no configured key"),
        ({"FERRY_API_KEYS": "alice=k1,bob=k1"}, "two tenants share a key"),
        ({"FERRY_API_KEYS": "alice="}, "every key must be non-empty"),
        ({"FERRY_API_KEYS": "alice"}, "comma-separated name=key pairs"),
    ):
        with pytest.raises(ValueError, match=named):  # pydantic's ValidationError is one
            load_settings(environ=bad)


def test_list_tuple_and_table_fields_take_json_from_the_environment(tmp_path):
    prefix = "FERRY_MODEL__ALL_MINILM_L6_V2__"
    environ = {
        f"{prefix}PAD_AXES": "[]",
        f"{prefix}PAD_VALUES": '{"attention_mask": -1}',
        f"{prefix}LABELS": '{"label": ["no", "yes"]}',
        f"{prefix}PREPROCESS__MEAN": "[0.5, 0.5, 0.5]",
        f"{prefix}PREPROCESS__STD": "0.25,0.25,0.25",
        "FERRY_PRIORITY_LEVELS": "[0, 5]",
        "FERRY_CORS_ALLOW_ORIGINS": "https://a.example, https://b.example",
    }
    settings = load_settings(write(tmp_path, TOML), environ=environ)
    (model,) = settings.models
    assert model.pad_axes == ()  # padding along no axis, not "every named one" (None)
    assert model.pad_values == {"attention_mask": -1.0}
    assert model.labels == {"label": ("no", "yes")}
    assert model.preprocess is not None
    assert (model.preprocess.mean, model.preprocess.std) == ((0.5,) * 3, (0.25,) * 3)
    assert settings.priority_levels == (0, 5)
    assert settings.cors_allow_origins == ("https://a.example", "https://b.example")
    unset = load_settings(write(tmp_path, TOML), environ={f"{prefix}PAD_AXES": "null"})
    assert unset.models[0].pad_axes is None
    # Text stays text: a path is never read as JSON.
    path = load_settings(write(tmp_path, TOML), environ={f"{prefix}PATH": "[weird]/m"})
    assert path.models[0].path == Path("[weird]/m")


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("FERRY_MODEL__ALL_MINILM_L6_V2__PAD_AXES", "[1]", "PAD_AXES (models.0.pad_axes.0)"),
        ("FERRY_MODEL__ALL_MINILM_L6_V2__PAD_VALUES", "{oops", "PAD_VALUES: not valid JSON"),
        ("FERRY_MODEL__ALL_MINILM_L6_V2__PAD_AXIS", "[]", "PAD_AXIS (models.0.pad_axis)"),
        ("FERRY_MODEL__ALL_MINILM_L6_V2__BACKEND__SESSIONS", "many", "SESSIONS (models.0.backend"),
        ("FERRY_PORT", "-1", "FERRY_PORT (port)"),
    ],
)
def test_a_value_the_settings_refuse_is_named_by_its_variable(tmp_path, key, value, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        load_settings(write(tmp_path, TOML), environ={key: value})


def test_ferry_serve_says_which_variable_is_wrong_without_a_traceback(tmp_path):
    environ = {**os.environ, "FERRY_MODEL__ALL_MINILM_L6_V2__PAD_AXES": "[1]"}
    command = [sys.executable, "-m", "ferry", "serve", "--config", str(write(tmp_path, TOML))]
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "FERRY_MODEL__ALL_MINILM_L6_V2__PAD_AXES (models.0.pad_axes.0)" in done.stderr
    assert "Traceback" not in done.stderr


SEQUENCES = {"controls": {"START": "start", "CORRID": "corrid"}}


@pytest.mark.parametrize(
    ("sequences", "server", "message"),
    [
        ({"controls": {"A": "start", "B": "start"}}, {}, "a control kind is given to two"),
        (
            {**SEQUENCES, "state": [{"input": "START", "output": "S"}]},
            {},
            "an input is named twice",
        ),
        ({"strategy": "direct", "max_candidate_sequences": 4}, {}, "the oldest strategy's"),
        (SEQUENCES, {"api_servers": 2}, "sequences live in one process"),
        (SEQUENCES, {"replicas": 2}, "sequences live in one process"),
    ],
)
def test_sequence_batching_settings_are_checked(sequences, server, message):
    model = {"name": "m", "path": "/m.onnx", "sequence_batching": sequences}
    with pytest.raises(ValidationError, match=message):
        load_settings(environ={}, extra_models=[model], **server)


MODELS = [{"name": "a", "path": "/a"}, {"name": "b", "path": "/b"}]


@pytest.mark.parametrize(
    ("server", "refusal"),
    [
        ({"load_models": ["a"]}, "model_control_mode = 'explicit'"),
        ({"model_control_mode": "poll", "load_models": ["a"]}, "with 'poll'"),
        ({"model_control_mode": "explicit", "load_models": ["*", "a"]}, "its only entry"),
        ({"model_control_mode": "explicit", "load_models": ["c"]}, "not configured: ['c']"),
        ({"model_control_mode": "push"}, "model_control_mode"),
        ({"repository_poll_secs": 0}, "repository_poll_secs"),
        ({"model_control_mode": "explicit", "replicas": 2}, "one replica only"),
    ],
)
def test_model_control_settings_are_checked(server, refusal):
    from ferry.server.settings import Settings

    with pytest.raises(ValidationError, match=re.escape(refusal)):
        Settings(**server, models=MODELS)


def test_explicit_mode_serves_only_load_models_at_start():
    from ferry.server.settings import Settings

    def served(**server):
        return [m.name for m in Settings(**server, models=MODELS).served_at_start().models]

    assert served() == ["a", "b"]
    assert served(model_control_mode="explicit") == []
    assert served(model_control_mode="explicit", load_models=["b"]) == ["b"]
    assert served(model_control_mode="explicit", load_models=["*"]) == ["a", "b"]


def test_settings_read_again_see_the_file_as_it_is_now(tmp_path):
    config = tmp_path / "ferry.toml"
    config.write_text('[[models]]\nname = "a"\npath = "a.onnx"\n')
    settings = load_settings(config, environ={}, model_control_mode="poll")
    config.write_text('[[models]]\nname = "b"\npath = "b.onnx"\n')
    again = settings.reread()
    assert [m.name for m in again.models] == ["b"]
    assert again.model_control_mode == "poll"  # the flags given at start still hold
