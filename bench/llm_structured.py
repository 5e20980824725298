"""Tokens/s with a JSON schema against unconstrained decoding, on the same prompts.

    python -m ferry.bench.llm_structured [--streams 1 4] [--max-tokens 64] [--rounds 3]

In-process (no HTTP), greedy, on the real default chat model (SmolLM2-135M-Instruct, int4). Each
mode runs `--streams` concurrent streams of `--rounds` requests each; the schema's answer is an
list of at least 64 items, so guided and free generations both run to `--max-tokens` and the
token counts match (printed).
Guided and free requests decode in the same batched lane, each guided row's logits masked by its
llguidance matcher (llm/grammar_rows.py). Printed per stream count: aggregate tokens/s of each
mode and their ratio (target >= 0.9), and what one grammar mask costs, measured with the
llguidance package on the same grammar and vocabulary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from ferry.bench.server_process import REPO
from ferry.llm.base import Guidance, SamplingSettings
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.ortgenai import OrtGenAIEngine

MODEL_DIR = REPO / "artifacts" / "models" / "SmolLM2-135M-Instruct"
PROMPTS = [
    "List some French cities as JSON.",
    "Give me the names of five rivers, as JSON.",
    "Which fruits are red? Answer in JSON.",
    "Name a few programming languages, in JSON.",
]
SCHEMA = {
    "type": "object",
    # At least 64 items: the answer cannot end before --max-tokens (up to ~128), as a free one.
    "properties": {
        "items": {
            "type": "array",
            "items": {"type": "string", "maxLength": 24},
            "minItems": 64,
        }
    },
    "required": ["items"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},  # what Ferry's serving layer adds
}


async def measure(
    engine: OrtGenAIEngine, sampling: SamplingSettings, streams: int, rounds: int
) -> tuple[int, float]:
    """(tokens generated, wall seconds) for `streams` concurrent streams of `rounds` requests."""
    prompts = [engine.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    total = 0

    async def stream(s: int) -> None:
        nonlocal total
        for r in range(rounds):
            ids = prompts[(s + r) % len(prompts)]
            async for delta in engine.generate(f"b-{s}-{r}-{time.monotonic_ns()}", ids, sampling):
                total += delta.token_count

    started = time.perf_counter()
    await asyncio.gather(*(stream(s) for s in range(streams)))
    return total, time.perf_counter() - started


def mask_cost(tokenizer: ChatTokenizer, tokens: int = 64) -> tuple[float, float]:
    """(mean, max) seconds llguidance takes to compute one token mask for SCHEMA on the model's
    vocabulary, outside the engine: og computes the same masks inside its step, untimed."""
    from llguidance import LLMatcher, LLTokenizer

    vocabulary = LLTokenizer((MODEL_DIR / "tokenizer.json").read_text())
    matcher = LLMatcher(vocabulary, LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA)))
    answer = '{"items":[' + ",".join(f'"city {i}"' for i in range(64)) + "]}"
    times = []
    for token in tokenizer.encode(answer)[:tokens]:
        started = time.perf_counter()
        matcher.compute_bitmask()
        times.append(time.perf_counter() - started)
        matcher.consume_token(token)
    return sum(times) / len(times), max(times)


async def run(streams_list: list[int], max_tokens: int, rounds: int) -> None:
    engine = OrtGenAIEngine(MODEL_DIR, name="smol", max_running=max(streams_list))
    await engine.start()
    free = SamplingSettings(max_tokens=max_tokens, temperature=0.0)
    guided = SamplingSettings(
        max_tokens=max_tokens,
        temperature=0.0,
        guidance=Guidance("json_schema", json.dumps(SCHEMA)),
    )
    try:
        await measure(engine, free, 1, 1)  # warm-up
        print(f"max_tokens={max_tokens} rounds={rounds}")
        mean, worst = mask_cost(engine.tokenizer)
        print(f"  llguidance mask per token: mean {mean * 1e6:.0f} us, max {worst * 1e6:.0f} us")
        for streams in streams_list:
            rates = {}
            for name, sampling in (("free", free), ("json_schema", guided)):
                tokens, seconds = await measure(engine, sampling, streams, rounds)
                rates[name] = tokens / seconds
                print(f"  streams={streams} {name:<12} {tokens:5d} tokens {rates[name]:7.1f} tok/s")
            ratio = rates["json_schema"] / rates["free"]
            print(f"  streams={streams} json_schema/free = {ratio:.2f}x (target >= 0.9)")
    finally:
        await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(run(args.streams, args.max_tokens, args.rounds))


if __name__ == "__main__":
    main()
