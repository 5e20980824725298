"""LLM tokens/s through Ferry's HTTP API vs onnxruntime-genai in-process, on the same prompts.

    python -m ferry.bench.llm_load [--requests 16] [--max-tokens 64]

Both sides use greedy decoding, so they generate the same tokens; the ratio is HTTP / in-process
at 1 and at 8 concurrent streams.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

import httpx

from ferry.bench.server_process import TINY_LLM, TINY_LLM_DIR, ferry_server, tiny_llm_config
from ferry.llm.base import SamplingSettings
from ferry.llm.ortgenai import OrtGenAIEngine

PROMPTS = [
    "def fibonacci(n):",
    "class Stack:",
    "import os\nimport sys\n",
    "def parse_args(argv):",
    "for line in open(path):",
    "try:\n    import json\nexcept ImportError:",
    "def __init__(self, name):",
    "with open(filename) as f:",
]


async def inprocess_tokens_per_s(prompts: list[str], concurrency: int, max_tokens: int) -> float:
    engine = OrtGenAIEngine(TINY_LLM_DIR, max_waiting=64)
    await engine.start()
    sampling = SamplingSettings(max_tokens=max_tokens, temperature=0.0)
    gate = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(prompt: str) -> None:
        nonlocal tokens
        async with gate:
            chat = engine.tokenizer.render_chat([{"role": "user", "content": prompt}])
            prompt_ids = engine.tokenizer.encode(chat)
            async for delta in engine.generate(uuid.uuid4().hex, prompt_ids, sampling):
                tokens += delta.token_count

    started = time.perf_counter()
    await asyncio.gather(*(one(p) for p in prompts))
    elapsed = time.perf_counter() - started
    await engine.close()
    return tokens / elapsed


async def http_tokens_per_s(
    url: str, prompts: list[str], concurrency: int, max_tokens: int
) -> float:
    gate = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(client: httpx.AsyncClient, prompt: str) -> None:
        nonlocal tokens
        body = {
            "model": TINY_LLM,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with gate, client.stream("POST", "/v1/chat/completions", json=body) as response:
            # Raw bytes, parsed once at the end: a client parsing every event would compete
            # with the server for the same two cores and measure itself.
            raw = b"".join([chunk async for chunk in response.aiter_raw()])
        events = [e for e in raw.decode().split("\n\n") if e.startswith("data: {")]
        tokens += json.loads(events[-1][6:])["usage"]["completion_tokens"]

    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        started = time.perf_counter()
        await asyncio.gather(*(one(client, p) for p in prompts))
        return tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=16, help="prompts per measurement")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]

    with ferry_server(models=[], llm_models=[tiny_llm_config(max_running=8)]) as server:
        asyncio.run(http_tokens_per_s(server.url, prompts[:4], 4, 8))  # warm-up
        for concurrency in (1, 8):
            direct = asyncio.run(inprocess_tokens_per_s(prompts, concurrency, args.max_tokens))
            served = asyncio.run(
                http_tokens_per_s(server.url, prompts, concurrency, args.max_tokens)
            )
            print(
                f"{concurrency} stream(s): in-process {direct:7.1f} tok/s, "
                f"ferry HTTP {served:7.1f} tok/s, ratio {served / direct:.2f}"
            )


if __name__ == "__main__":
    main()
