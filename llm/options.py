"""Each LLM engine's own options, told apart by `engine`: the settings only that engine honours.

An `[[llm_models]]` table is written flat (`engine = "vllm"` beside `gpu_memory_utilization`);
the server's settings hand its engine keys to `engine_options`, which sorts them into the
engine's options and refuses, by name, a key that belongs to another engine: a setting the
chosen engine would ignore is refused at start, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Engine = Literal["ortgenai", "vllm"]
DEFAULT_ENGINE: Engine = "ortgenai"


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OrtGenAIOptions(_Options):
    # An onnxruntime-genai model folder (`ferry export llm`), run on the CPU; a key of the vllm
    # table is refused at start.
    engine: Literal["ortgenai"] = "ortgenai"
    # Generations decoded at once; None: the engine's default (16).
    max_running: int | None = Field(default=None, ge=1)
    # Generations queued behind the running ones; beyond running + waiting, 429 (a request
    # needing more than both is a 400).
    max_waiting: int = Field(default=64, ge=0)
    # Prompt tokens each prompt gets in per turn, so that long prompts share turns with the
    # streams decoding; 0: a whole prompt at once. 1 is refused: a one-token piece runs other
    # CPU kernels, so greedy text would change.
    prefill_chunk: int = Field(default=256, ge=0)
    # Microseconds the decoder's thread pool spins between ops before it sleeps. A decode step
    # is some 300 ops a few microseconds apart: a pool asleep between them pays a futex wake for
    # each. 50 spans those gaps but not the hundreds of microseconds between steps, so the
    # threads sleep whenever the owner does Python work or nothing runs (bench.llm_peer, 2-core
    # Sapphire Rapids, SmolLM2: 1.27-1.48x tok/s at 1 and 8 streams against 0; 150 and 500 no
    # better). 0: they sleep at once.
    spin_us: int = Field(default=50, ge=0, le=10_000)
    # Draft-free speculative decoding (prompt lookup, llama-server's `--spec-type ngram-simple`)
    # for a request decoding alone (one stream): the tokens that followed the latest earlier
    # occurrence of the text's last 3 (down to 2) tokens, in its prompt and output, are checked,
    # up to this many, in one forward pass; 0: off. Off by default: the checking pass runs the
    # prompt's CPU kernels, whose rounding differs from a decode step's, so greedy text may differ
    # from that without speculation, as it may between one and several streams (docs/apis.md);
    # refused with batch_invariant, whose greedy text must not depend on running alone.
    spec_tokens: int = Field(default=0, ge=0, le=64)

    @field_validator("prefill_chunk")
    @classmethod
    def _check_prefill_chunk(cls, value: int) -> int:
        if value == 1:  # a one-token piece runs other CPU kernels: greedy text would change
            raise ValueError("prefill_chunk must be 0 (whole prompts) or at least 2")
        return value


class VLLMOptions(_Options):
    # A Hugging Face model folder served by vLLM (GPU hosts; the `vllm` extra); a key of the
    # ortgenai table is refused at start.
    engine: Literal["vllm"]
    # The share of the GPU's memory vLLM takes for weights and its KV cache (vLLM's own).
    gpu_memory_utilization: float = Field(default=0.3, gt=0, le=1)
    # The largest LoRA rank an adapter may have (vLLM's max_lora_rank): it sizes LoRA buffers.
    max_lora_rank: int = Field(default=16, ge=1)


ENGINE_OPTIONS: dict[str, type[OrtGenAIOptions] | type[VLLMOptions]] = {
    "ortgenai": OrtGenAIOptions,
    "vllm": VLLMOptions,
}


# `engine` is always there: engine_options puts it in, with its default when a table has none.
EngineOptions = Annotated[OrtGenAIOptions | VLLMOptions, Field(discriminator="engine")]


def option_names() -> set[str]:
    """Every engine's option keys, `engine` included."""
    return {name for options in ENGINE_OPTIONS.values() for name in options.model_fields}


def foreign_option(engine: object, key: str) -> str | None:
    """Why `key` is refused for `engine` when it is another engine's option; else None (an
    engine that is none of them is refused on its own)."""
    chosen = ENGINE_OPTIONS.get(engine) if isinstance(engine, str) else None
    if chosen is None or key in chosen.model_fields:
        return None
    owner = next((e for e, o in ENGINE_OPTIONS.items() if key in o.model_fields), None)
    if owner is None:
        return None
    article = "an" if owner[0] in "aeiou" else "a"
    return f'{key} is {article} {owner} setting; engine "{engine}" does not use it'


def engine_options(fields: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A flat `[[llm_models]]` table split into (its engine's options, every other key).

    A key that is another engine's option is refused, naming the key and both engines."""
    engine = fields.get("engine", DEFAULT_ENGINE)
    if not isinstance(engine, str) or engine not in ENGINE_OPTIONS:
        raise ValueError(f"engine must be ortgenai or vllm, got {engine!r}")
    options: dict[str, Any] = {"engine": engine}
    rest: dict[str, Any] = {}
    for key, value in fields.items():
        if key in ENGINE_OPTIONS[engine].model_fields:
            options[key] = value
        elif refused := foreign_option(engine, key):
            raise ValueError(refused)
        else:
            rest[key] = value
    return options, rest
