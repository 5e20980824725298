"""In-process onnxruntime-genai references the served results are compared with: plain Generators,
no Ferry code between the test and the runtime beyond `log_softmax`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og

from ferry.llm.logprobs import log_softmax


def eos_ids(model_dir: Path) -> set[int]:
    """The ids generation stops at, from genai_config.json."""
    eos = json.loads((model_dir / "genai_config.json").read_text())["model"]["eos_token_id"]
    return set(eos if isinstance(eos, list) else [eos])


def prompt_logprobs(model: Any, ids: list[int]) -> np.ndarray:
    """log-softmax rows of one forward pass over `ids`: row i scores the token after ids[i]."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 1)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(ids, dtype=np.int32))
    return log_softmax(generator.get_output("logits")[0])


def greedy(
    model: Any,
    ids: list[int],
    max_tokens: int,
    eos_ids: set[int],
    guidance: tuple[str, str] | None = None,
    adapter: tuple[Any, str] | None = None,
    **search: Any,
) -> tuple[list[int], list[np.ndarray]]:
    """Greedy new ids, ending before an end-of-sequence token (served text leaves it out), and
    the log-softmax row each was chosen from; `guidance`: og's own (kind, data) grammar;
    `adapter`: (og.Adapters, name) to activate; `search`: more search options (penalties)."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + max_tokens, do_sample=False, **search)
    if guidance is not None:
        params.set_guidance(*guidance)
    generator = og.Generator(model, params)
    if adapter is not None:
        generator.set_active_adapter(*adapter)
    generator.append_tokens(np.asarray(ids, dtype=np.int32))
    new: list[int] = []
    rows: list[np.ndarray] = []
    while not generator.is_done() and len(new) < max_tokens:
        row = log_softmax(generator.get_logits()[0, -1])
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        if token in eos_ids:
            break
        new.append(token)
        rows.append(row)
    return new, rows
