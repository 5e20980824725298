"""LLM tokens/s through Ferry's HTTP API vs onnxruntime-genai in-process, on the same prompts.

    python -m ferry.bench.llm_load [--model default|tiny] [--streams 1,4,8]
                                   [--requests 16] [--max-tokens 64]

Every side decodes greedily. Four sides: `og.Engine`, the runtime's static batching driven
directly with no Ferry code (bench/og_direct.py); `engine`, Ferry's OrtGenAIEngine in-process (its
batch lane on the owner thread, no HTTP); `determin.`, the same in its deterministic mode
(`batch_invariant = true`: greedy text independent of load); `HTTP`, `ferry serve` with the
default encoder and the chat model loaded, streamed chat completions read by httpx. Per stream
count: aggregate
tokens/s of each side, HTTP's ratio to both, median time to first token (TTFT) and median
inter-token latency (ITL: a request's decode time over its tokens after the first), and the GFLOPS
HTTP's tokens/s use against this machine's measured numpy float32 GEMM throughput. Ends with the
server's resident memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from ferry.bench.flops import flops_per_token_of, gemm_gflops
from ferry.bench.og_direct import og_engine_run
from ferry.bench.server_process import (
    DEFAULT_LLM,
    DEFAULT_LLM_DIR,
    DEFAULT_LLM_HF_DIR,
    TINY_LLM,
    TINY_LLM_DIR,
    ferry_server,
)
from ferry.llm.base import SamplingSettings
from ferry.llm.ortgenai import OrtGenAIEngine

# name -> (served name, onnxruntime-genai folder, Hugging Face folder for the FLOPs estimate)
MODELS = {
    "default": (DEFAULT_LLM, DEFAULT_LLM_DIR, DEFAULT_LLM_HF_DIR),
    "tiny": (TINY_LLM, TINY_LLM_DIR, TINY_LLM_DIR.parent / "hf"),
}
# Open-ended requests, so that greedy answers run to --max-tokens rather than end early.
PROMPTS = [
    "Write a story about a lighthouse keeper.",
    "Explain how a steam engine works.",
    "Describe a walk through a forest in autumn.",
    "Write a letter to a friend about your holiday.",
    "Explain why the sky is blue.",
    "Describe the life of a honeybee.",
    "Write a poem about the sea.",
    "Explain how bread is made.",
]


@dataclass(frozen=True)
class RequestTiming:
    tokens: int
    ttft_s: float  # request sent -> first token
    itl_s: float | None  # mean gap between tokens after the first; None for one token


def request_timing(started: float, token_times: list[tuple[float, int]]) -> RequestTiming:
    """From (arrival time, tokens it brought) of each delta with tokens, in order."""
    tokens = sum(n for _, n in token_times)
    first_at, first_tokens = token_times[0]
    later = tokens - first_tokens
    itl = (token_times[-1][0] - first_at) / later if later > 0 else None
    return RequestTiming(tokens, first_at - started, itl)


@dataclass(frozen=True)
class RunResult:
    tokens_per_s: float
    timings: list[RequestTiming]

    @property
    def ttft_ms(self) -> float:
        return 1000 * statistics.median(t.ttft_s for t in self.timings)

    @property
    def itl_ms(self) -> float:
        gaps = [t.itl_s for t in self.timings if t.itl_s is not None]
        return 1000 * statistics.median(gaps) if gaps else float("nan")


async def _gated(prompts: list[str], concurrency: int, one) -> RunResult:
    gate = asyncio.Semaphore(concurrency)

    async def run(prompt: str) -> RequestTiming:
        async with gate:
            return await one(prompt)

    started = time.perf_counter()
    timings = await asyncio.gather(*(run(p) for p in prompts))
    elapsed = time.perf_counter() - started
    return RunResult(sum(t.tokens for t in timings) / elapsed, list(timings))


def og_direct(model_dir: Path, prompts: list[str], concurrency: int, max_tokens: int) -> RunResult:
    from ferry.llm.chat_tokenizer import ChatTokenizer

    chat = ChatTokenizer(model_dir)
    ids = [chat.encode_chat([{"role": "user", "content": p}]) for p in prompts]
    tokens_per_s, runs = og_engine_run(model_dir, ids, concurrency, max_tokens)
    return RunResult(tokens_per_s, [request_timing(start, times) for start, times in runs if times])


async def inprocess(
    model_dir: Path,
    prompts: list[str],
    concurrency: int,
    max_tokens: int,
    deterministic: bool = False,
) -> RunResult:
    engine = OrtGenAIEngine(model_dir, max_running=8, max_waiting=64, deterministic=deterministic)
    await engine.start()
    sampling = SamplingSettings(max_tokens=max_tokens, temperature=0.0)

    async def one(prompt: str) -> RequestTiming:
        ids = engine.tokenizer.encode_chat([{"role": "user", "content": prompt}])
        started, arrivals = time.perf_counter(), []
        async for delta in engine.generate(uuid.uuid4().hex, ids, sampling):
            if delta.token_count:
                arrivals.append((time.perf_counter(), delta.token_count))
        return request_timing(started, arrivals)

    try:
        await _gated(prompts[:2], 2, one)  # warm-up
        return await _gated(prompts, concurrency, one)
    finally:
        await engine.close()


def sse_token_times(arrivals: list[tuple[float, bytes]]) -> tuple[list[tuple[float, int]], int]:
    """Raw SSE bytes with their arrival times -> (time, 1) per chunk with content, and the usage's
    completion_tokens. Each chunk carries the tokens of one engine delta; the total comes from
    usage, so the count of chunks only places the first and last token in time."""
    buffer, events = b"", []
    for at, raw in arrivals:
        buffer += raw
        *complete, buffer = buffer.split(b"\n\n")
        events += [(at, e) for e in complete if e.startswith(b"data: {")]
    times, usage = [], 0
    for at, event in events:
        body = json.loads(event[6:])
        if body.get("usage"):
            usage = body["usage"]["completion_tokens"]
        if any(c["delta"].get("content") for c in body.get("choices", [])):
            times.append((at, 1))
    if times and usage > len(times):  # deltas that held several tokens: the last brings the rest
        times[-1] = (times[-1][0], usage - len(times) + 1)
    return times, usage


async def over_http(
    url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int
) -> RunResult:
    async def one(prompt: str) -> RequestTiming:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        started, arrivals = time.perf_counter(), []
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            # Raw bytes with their arrival time, parsed at the end: a client parsing every
            # event would compete with the server for the same cores and measure itself.
            async for raw in response.aiter_raw():
                arrivals.append((time.perf_counter(), raw))
        times, _ = sse_token_times(arrivals)
        return request_timing(started, times)

    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        await _gated(prompts[:2], 2, one)  # warm-up
        return await _gated(prompts, concurrency, one)


def rss_mib(pid: int) -> tuple[float, float]:
    """(resident, peak resident) MiB of a process, from /proc."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return tuple(int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=sorted(MODELS), default="default")
    parser.add_argument("--streams", default="1,4,8", help="concurrent streams, comma-separated")
    parser.add_argument("--requests", type=int, default=16, help="prompts per measurement")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    name, model_dir, hf_dir = MODELS[args.model]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
    streams = [int(s) for s in args.streams.split(",")]

    gemm = gemm_gflops()  # before anything else runs on these cores
    flops = flops_per_token_of(hf_dir)
    print(f"numpy float32 GEMM (1024^3): {gemm:.1f} GFLOPS")
    if flops:
        print(f"{name}: {flops / 1e9:.3f} GFLOP per token (2 x matmul weights)")
    llm = {"name": name, "engine": "ortgenai", "path": str(model_dir), "max_running": 8}
    rows = []
    with ferry_server(llm_models=[llm]) as server:  # with the default encoder, as `make serve`
        for concurrency in streams:
            raw = og_direct(model_dir, prompts, concurrency, args.max_tokens)
            engine = asyncio.run(inprocess(model_dir, prompts, concurrency, args.max_tokens))
            fixed = asyncio.run(
                inprocess(model_dir, prompts, concurrency, args.max_tokens, deterministic=True)
            )
            served = asyncio.run(over_http(server.url, name, prompts, concurrency, args.max_tokens))
            rows.append((concurrency, served))
            print(f"{concurrency} stream(s):")
            sides = (("og.Engine", raw), ("engine", engine), ("determin.", fixed), ("HTTP", served))
            for side, result in sides:
                print(
                    f"  {side:>9} {result.tokens_per_s:7.1f} tok/s  TTFT {result.ttft_ms:7.1f} ms"
                    f"  ITL {result.itl_ms:6.1f} ms"
                )
            used = f", {served.tokens_per_s * flops / 1e9:.1f} GFLOPS" if flops else ""
            print(
                f"  HTTP / og.Engine {served.tokens_per_s / raw.tokens_per_s:.2f}, "
                f"HTTP / engine {served.tokens_per_s / engine.tokens_per_s:.2f}, "
                f"deterministic / engine {fixed.tokens_per_s / engine.tokens_per_s:.2f}{used}"
            )
        assert server.pid is not None
        rss, peak = rss_mib(server.pid)
    print(f"server RSS with all-MiniLM-L6-v2 + {name} loaded: {rss:.0f} MiB (peak {peak:.0f} MiB)")
    by_streams = {c: s.tokens_per_s for c, s in rows}
    if 1 in by_streams and 8 in by_streams:
        print(f"HTTP 8 streams / 1 stream: {by_streams[8] / by_streams[1]:.2f}x (target >= 2x)")
    if flops:
        best = max(by_streams.values()) * flops / 1e9
        print(f"best HTTP rate uses {best:.1f} of {gemm:.1f} GEMM GFLOPS ({best / gemm:.0%})")


if __name__ == "__main__":
    main()
