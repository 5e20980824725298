"""`[[llm_models]]` tables: written flat, each engine's keys read into its own options, and a key
of the other engine refused at start, naming it (a setting Ferry cannot honour is never ignored)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from ferry.llm.options import ENGINE_OPTIONS, OrtGenAIOptions, VLLMOptions
from ferry.server.errors import LoadRefused
from ferry.server.model_overrides import with_config
from ferry.server.settings import LLMSettings, SettingsError, load_settings

pytestmark = pytest.mark.unit

# (engine, a key only the other engine honours, a value valid there): each must be refused.
FOREIGN = [
    ("ortgenai", "gpu_memory_utilization", 0.5),
    ("ortgenai", "max_lora_rank", 8),
    ("vllm", "max_running", 4),
    ("vllm", "max_waiting", 8),
    ("vllm", "prefill_chunk", 0),
    ("vllm", "spin_us", 200),
    ("vllm", "spec_tokens", 8),
]
OTHER = {"ortgenai": "vllm", "vllm": "ortgenai"}


def toml(engine: str, key: str, value: object) -> str:
    return f'[[llm_models]]\nname = "m"\npath = "/m"\nengine = "{engine}"\n{key} = {value}\n'


def test_the_table_names_every_option_of_each_engine():
    """A new engine option belongs in FOREIGN, so that the other engine is shown to refuse it."""
    for engine, options in ENGINE_OPTIONS.items():
        refused_elsewhere = {key for e, key, _ in FOREIGN if e == OTHER[engine]}
        assert refused_elsewhere == set(options.model_fields) - {"engine"}


@pytest.mark.parametrize(("engine", "key", "value"), FOREIGN)
def test_a_key_of_the_other_engine_is_refused_at_start_naming_it(tmp_path, engine, key, value):
    config = tmp_path / "ferry.toml"
    config.write_text(toml(engine, key, value))
    with pytest.raises(ValidationError) as refused:
        load_settings(config, environ={})
    message = f"{key} is {'an' if engine == 'vllm' else 'a'} {OTHER[engine]} setting; "
    assert message + f'engine "{engine}" does not use it' in str(refused.value)


@pytest.mark.parametrize(("engine", "key", "value"), FOREIGN)
def test_the_same_key_reaches_its_own_engines_options(tmp_path, engine, key, value):
    config = tmp_path / "ferry.toml"
    config.write_text(toml(OTHER[engine], key, value))
    llm = load_settings(config, environ={}).llm_models[0]
    assert (llm.engine, getattr(llm.options, key)) == (OTHER[engine], value)


@pytest.mark.parametrize(("engine", "key", "value"), FOREIGN)
def test_a_load_config_with_the_other_engines_key_is_refused_naming_it(engine, key, value):
    entry = LLMSettings.model_validate({"name": "m", "path": "/m", "engine": engine})
    with pytest.raises(LoadRefused, match=f"{key} is an? {OTHER[engine]} setting") as refused:
        with_config(entry, f'{{"{key}": {value}}}')
    assert refused.value.field == f"parameters.config.{key}"


def test_an_environment_variable_sets_an_engine_option_and_is_named_when_refused(tmp_path):
    config = tmp_path / "ferry.toml"
    config.write_text(toml("ortgenai", "max_waiting", 8))
    environ = {"FERRY_MODEL__M__MAX_RUNNING": "3"}
    assert load_settings(config, environ=environ).llm_models[0].options.max_running == 3  # type: ignore[union-attr]
    with pytest.raises(
        SettingsError, match=r"FERRY_MODEL__M__MAX_RUNNING \(llm_models.0.max_running\)"
    ):
        load_settings(config, environ={"FERRY_MODEL__M__MAX_RUNNING": "0"})


def test_defaults_are_the_ortgenai_engines():
    llm = LLMSettings(name="m", path=Path("/m"))
    assert llm.options == OrtGenAIOptions()
    assert (llm.options.max_running, llm.options.max_waiting, llm.options.prefill_chunk) == (
        None,
        64,
        256,
    )
    vllm = LLMSettings.model_validate({"name": "m", "path": "/m", "engine": "vllm"})
    assert vllm.options == VLLMOptions(engine="vllm", gpu_memory_utilization=0.3, max_lora_rank=16)


@pytest.mark.parametrize(
    ("fields", "refusal"),
    [
        ({"engine": "llama"}, "engine must be ortgenai or vllm, got 'llama'"),
        ({"options": {"engine": "vllm"}}, "an engine's settings are keys of the table itself"),
        ({"prefill_chunk": 1}, "prefill_chunk must be 0"),
        ({"spec_tokens": 65}, "spec_tokens"),
        # Speculation is for a lone request only, with other rounding: greedy text would depend
        # on load, which batch_invariant rules out (measured on SmolLM2, ortgenai_batch.py).
        ({"spec_tokens": 8, "batch_invariant": True}, "cannot be combined with batch_invariant"),
    ],
)
def test_other_refusals(fields, refusal):
    with pytest.raises(ValidationError, match=refusal):
        LLMSettings.model_validate({"name": "m", "path": "/m", **fields})


def test_settings_dump_flat_as_they_are_written():
    llm = LLMSettings.model_validate(
        {"name": "m", "path": "/m", "engine": "vllm", "max_lora_rank": 8}
    )
    dumped = llm.model_dump(mode="json", exclude_unset=True)
    assert dumped == {"name": "m", "path": "/m", "engine": "vllm", "max_lora_rank": 8}
    assert LLMSettings.model_validate(dumped) == llm
