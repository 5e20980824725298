"""N-gram speculation on a quoting workload: one stream, speculation off vs on (issue 45).

    python -m ferry.bench.llm_spec [--model DIR] [--spec-tokens 8] [--max-tokens 128]
                                   [--rounds 1]

Prompts that ask the model to repeat or edit text or code they give (where prompt lookup should
pay), each run alone through the ortgenai engine in-process (its owner loop, as served), greedy,
with `spec_tokens` 0 and then `--spec-tokens`. Prints per prompt the decode tokens/s (first token
to last) both ways, their ratio and whether the greedy text is identical; then the speed-up over
the prompts whose text was identical. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from ferry.llm.base import SamplingSettings
from ferry.llm.ortgenai import OrtGenAIEngine

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "artifacts/models/SmolLM2-135M-Instruct"
PASSAGE = (
    "The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran off "
    "into the forest, where it met an owl who asked it why it was in such a hurry."
)
TYPOS = (
    "Teh cat sat on teh mat. It was a sunny day and the cat was very hapy. It looked at the "
    "birds in the tree and wondred if it could catch one."
)
CODE = (
    "def area(width, height):\n    return width * height\n\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n"
)
TASKS = (
    f"Copy the following text word for word: {PASSAGE}",
    f"Fix the typos in this text and return it: {TYPOS}",
    f"Repeat this text exactly, in capital letters where a sentence starts: {PASSAGE}",
    f"Rewrite this code with the function names in upper case:\n\n{CODE}",
    f"Summarise this text, quoting its first sentence: {PASSAGE}",
    f"Replace every 'fox' with 'cat' in this text: {PASSAGE}",
)


async def one(engine: OrtGenAIEngine, ids: list[int], max_tokens: int) -> tuple[str, int, float]:
    """(text, tokens, seconds from the first token to the last)."""
    sampling = SamplingSettings(max_tokens=max_tokens, temperature=0.0)
    text, tokens, first, last = "", 0, 0.0, 0.0
    async for delta in engine.generate("bench", ids, sampling):
        now = time.perf_counter()
        if delta.token_count and not tokens:
            first = now
        tokens += delta.token_count
        text += delta.text
        last = now
    return text, tokens, last - first


async def served(args: argparse.Namespace, spec_tokens: int) -> list[tuple[str, int, float]]:
    engine = OrtGenAIEngine(
        args.model,
        name="spec",
        prefix_cache=False,
        spec_tokens=spec_tokens,
    )
    await engine.start()
    try:
        results = []
        for task in TASKS:
            ids = engine.tokenizer.encode_chat([{"role": "user", "content": task}])
            runs = [await one(engine, ids, args.max_tokens) for _ in range(args.rounds)]
            text, tokens = runs[0][0], runs[0][1]
            results.append((text, tokens, min(r[2] for r in runs)))
        return results
    finally:
        await engine.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--spec-tokens", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1, help="runs per prompt (fastest kept)")
    args = parser.parse_args(argv)
    off = asyncio.run(served(args, 0))
    on = asyncio.run(served(args, args.spec_tokens))
    print(f"{'prompt':>6} {'tokens':>6} {'off tok/s':>9} {'on tok/s':>9} {'on/off':>6} same")
    same_count, time_off, time_on, total = 0, 0.0, 0.0, 0
    for i, ((text0, n0, t0), (text1, n1, t1)) in enumerate(zip(off, on, strict=True)):
        same = text0 == text1
        same_count += same
        rate0, rate1 = (n0 - 1) / max(t0, 1e-9), (n1 - 1) / max(t1, 1e-9)
        print(f"{i:>6} {n0:>6} {rate0:>9.1f} {rate1:>9.1f} {rate1 / max(rate0, 1e-9):>6.2f} {same}")
        if same:  # the speed-up only where the same tokens were decoded
            time_off, time_on, total = time_off + t0, time_on + t1, total + n0 - 1
    print(f"identical greedy text: {same_count}/{len(TASKS)}")
    if total:
        print(
            f"on the identical ones: {total / time_off:.1f} -> {total / time_on:.1f} tok/s "
            f"({time_off / time_on:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
