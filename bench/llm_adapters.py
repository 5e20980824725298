"""Tokens/s per served name when base and LoRA-adapter requests share one onnxruntime-genai engine.

    python -m ferry.bench.llm_adapters [--streams 4] [--max-tokens 64] [--rounds 3]

In-process (no HTTP), greedy, on the committed tiny model and adapters. Each served name gets
`--streams` concurrent streams, each running `--rounds` requests back to back; printed per name:
aggregate tokens/s over the whole run and the mean per-request decode rate.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict

from ferry.bench.server_process import REPO, TINY_LLM_DIR
from ferry.llm.base import SamplingSettings
from ferry.llm.ortgenai import OrtGenAIEngine

ADAPTERS = {
    n: REPO / "models" / "tiny-llm" / "adapters" / n / f"{n}.onnx_adapter" for n in ("zen", "shout")
}
PROMPT = [{"role": "user", "content": "def parse_args(argv):"}]


async def run(names: list[str | None], streams: int, max_tokens: int, rounds: int) -> None:
    engine = OrtGenAIEngine(TINY_LLM_DIR, adapters=ADAPTERS, max_running=8, max_waiting=256)
    await engine.start()
    prompt_ids = engine.tokenizer.encode(engine.tokenizer.render_chat(PROMPT))
    sampling = SamplingSettings(max_tokens=max_tokens, temperature=0.0)
    tokens: dict[str, int] = defaultdict(int)
    rates: dict[str, list[float]] = defaultdict(list)

    async def stream(name: str | None, s: int) -> None:
        for r in range(rounds):
            started, count = time.perf_counter(), 0
            async for delta in engine.generate(
                f"{name}-{s}-{r}", prompt_ids, sampling, adapter=name
            ):
                count += delta.token_count
            tokens[name or "base"] += count
            rates[name or "base"].append(count / (time.perf_counter() - started))

    started = time.perf_counter()
    await asyncio.gather(*(stream(n, s) for n in names for s in range(streams)))
    elapsed = time.perf_counter() - started
    await engine.close()
    mix = " + ".join(f"{streams}x{n or 'base'}" for n in names)
    print(f"{mix}: {sum(tokens.values()) / elapsed:7.1f} tok/s in all")
    for name, total in sorted(tokens.items()):
        per_request = sum(rates[name]) / len(rates[name])
        print(f"  {name:6s} {total / elapsed:7.1f} tok/s, {per_request:6.1f} tok/s per request")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=4, help="concurrent streams per name")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for names in ([None], ["zen"], [None, "zen", "shout"]):
        asyncio.run(run(names, args.streams, args.max_tokens, args.rounds))


if __name__ == "__main__":
    main()
