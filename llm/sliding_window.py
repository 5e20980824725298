"""Whether an onnxruntime-genai export's sliding-window attention is something Ferry serves right.

Ferry's batched lane (ortgenai_kv.py) keeps every layer's keys and values at the sequence's full
length, and the attention kernel applies each layer's window (GroupQueryAttention's
`local_window_size`) over that full cache. onnxruntime-genai's builder by default gives
sliding-window layers a window-sized ring instead (genai_config.json's `decoder.sliding_window`,
`sliding_window_cache=1` on their attention), which that lane cannot hold: every request then
failed with `KV cache capacity (n) must be at least local_window_size (w)`. For a model whose
config names no sliding layers (Mistral-style) the builder writes the same section with no layers
and leaves the attention unwindowed, so long prompts gave other text than transformers.
`ferry export llm` builds with full caches and the window on the right layers; anything else is
refused when the engine is built, naming the architecture and why.
"""

from __future__ import annotations

from typing import Any

from ferry.llm.errors import UnservableModel


def check_sliding_window(genai_config: dict[str, Any]) -> None:
    """Raise UnservableModel for an export with the builder's windowed KV caches."""
    model = genai_config["model"]
    section = model["decoder"].get("sliding_window")
    if not section:
        return
    arch, window = model.get("type", "this model"), section.get("window_size")
    layers = section.get("layers") or []
    if layers:
        reason = (
            f"its sliding-window layers {layers} keep a {window}-token ring of keys and values "
            "(onnxruntime-genai's windowed_kv_cache), which Ferry's batched decoding does not "
            "hold"
        )
    else:
        reason = (
            f"genai_config.json gives a {window}-token sliding window that no layer's attention "
            "applies, so prompts longer than the window would give wrong text"
        )
    raise UnservableModel(
        f"{arch}: {reason}. Re-export it with `ferry export llm`, which builds full KV caches "
        "with the window in the attention kernels."
    )
