"""An encoder's outputs as requests see them: the backend's own and those derived from a head's
logits, their widths, the one check of requested names and the rendering of a row.

The same rules wherever the model runs: a `ModelRuntime` builds them from its backend, an API
process's stand-in (server/procs/remote.py) from what the engine process reports.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ferry.backends.manifest import ModelManifest
from ferry.server.errors import InvalidInput
from ferry.server.settings import ModelSettings

# Outputs computed from `logits` (not the backend's own): a classifier's label and softmax,
# or a one-logit head's (a cross-encoder's) sigmoid, where a softmax would always be 1.0.
CLASS_OUTPUTS = ("label", "probabilities")
SCORE_OUTPUTS = ("score",)
DERIVED_OUTPUTS = (*CLASS_OUTPUTS, *SCORE_OUTPUTS)
HEAD_TASKS = ("classification", "rerank")


def distinct(names: tuple[str, ...]) -> tuple[str, ...]:
    """Checked output names, each asked for once: copies add nothing to an answer but its size
    (400,000 of one froze the event loop rendering them)."""
    if len(set(names)) != len(names):
        twice = next(name for name, count in Counter(names).items() if count > 1)
        raise InvalidInput(
            "outputs", f"output {twice!r} already exists in request: asked for more than once"
        )
    return names


class BackendInfo(Protocol):
    """What the server reads of a model's backend (output rules, KServe metadata): a `Backend`,
    or in an API process a view of the engine process's."""

    @property
    def name(self) -> str: ...
    @property
    def output_names(self) -> tuple[str, ...]: ...
    @property
    def sequence_outputs(self) -> frozenset[str]: ...
    @property
    def max_concurrency(self) -> int: ...
    @property
    def takes_token_types(self) -> bool: ...


@dataclass(frozen=True)
class ModelOutputs:
    settings: ModelSettings
    manifest: ModelManifest
    backend: BackendInfo
    # Floats per item (pooled) or per token (sequence outputs); empty until the model started.
    widths: Mapping[str, int]

    @property
    def scores(self) -> bool:
        """A one-logit head (a cross-encoder): it answers a score, not a class."""
        return self.manifest.task in HEAD_TASKS and self.widths.get("logits") == 1

    @property
    def servable(self) -> tuple[str, ...]:
        names = self.backend.output_names
        if self.manifest.task in HEAD_TASKS and "logits" in names:
            return (*names, *(SCORE_OUTPUTS if self.scores else CLASS_OUTPUTS))
        return names

    @property
    def defaults(self) -> tuple[str, ...]:
        """The configured outputs; a head's derived ones when the config names none."""
        if "outputs" in self.settings.model_fields_set or self.manifest.task not in HEAD_TASKS:
            return self.settings.outputs
        return SCORE_OUTPUTS if self.scores else CLASS_OUTPUTS

    def width(self, name: str) -> int:
        return self.widths.get(name, 1)

    def is_sequence(self, name: str) -> bool:
        return name in self.backend.sequence_outputs

    def select(
        self, requested: Sequence[str | None] | None, *, tensors: bool = False
    ) -> tuple[str, ...]:
        """The outputs a request wants, checked (the one check of output names): the ones it
        names, else the configured ones. `tensors` (KServe): only the backend's own outputs,
        all of them by default, since the derived ones are no FP32 tensors."""
        choices = self.backend.output_names if tensors else self.servable
        named: list[str] = []
        for name in requested or ():
            if name not in choices:
                raise InvalidInput(
                    "outputs", f"unknown output {name!r}; choose from {list(choices)}"
                )
            named.append(name)
        if named:
            return distinct(tuple(named))
        return tuple(choices) if tensors else self.defaults

    def for_backend(self, names: Sequence[str]) -> frozenset[str]:
        """What the backend must fetch for `names`: derived outputs come from the logits."""
        return frozenset("logits" if name in DERIVED_OUTPUTS else name for name in names)

    def render(self, row: Mapping[str, Any], outputs: Sequence[str]) -> dict[str, Any]:
        """One request's raw outputs -> the JSON-ready values it asked for."""
        if self.scores and "logits" in row:
            row = {**row, "score": sigmoid(float(row["logits"][0]))}
        elif self.manifest.task in HEAD_TASKS and "logits" in row:
            logits = row["logits"].astype(np.float64)
            exp = np.exp(logits - logits.max())
            probabilities = exp / exp.sum()
            labels = [self.manifest.id2label.get(i, str(i)) for i in range(len(probabilities))]
            derived = {
                "label": labels[int(np.argmax(probabilities))],
                "probabilities": dict(zip(labels, probabilities.tolist(), strict=True)),
            }
            row = {**row, **derived}
        # Arrays stay arrays: the JSON encoder writes them.
        return {name: row[name] for name in outputs}


def sigmoid(logit: float) -> float:
    """A one-logit head's probability (TEI's and vLLM's score for a cross-encoder)."""
    return 0.5 * (1.0 + math.tanh(logit / 2))  # no overflow for any logit
