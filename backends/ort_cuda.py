"""ONNX Runtime on the CUDA EP with IO binding: outputs nobody reads are not copied to the host.

`session.run(None, feeds)` copies every output back to the host; with IO binding an output left
out of `wanted` stays in device memory (`last_hidden_state` is batch x length x hidden floats,
far larger than the pooled embedding). Inputs are bound from the host: ONNX Runtime copies them
once per run, as `run` does. Unmeasured: written for the GPU path, no GPU has run it yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


def run_bound(
    session: Any,
    feeds: dict[str, np.ndarray],
    output_names: Sequence[str],
    wanted: Iterable[str] = (),
) -> list[np.ndarray | None]:
    """Run once; host arrays for the outputs in `wanted` (all when empty), None for the rest."""
    keep = set(wanted) or set(output_names)
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, np.ascontiguousarray(value))
    for name in output_names:
        binding.bind_output(name, "cpu" if name in keep else "cuda")
    session.run_with_iobinding(binding)
    values = binding.get_outputs()
    return [
        value.numpy() if name in keep else None
        for name, value in zip(output_names, values, strict=True)
    ]
