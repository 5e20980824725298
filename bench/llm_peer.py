"""Ferry's CPU LLM serving against llama.cpp's `llama-server` on the same model (issues 27, 38).

    python -m ferry.bench.llm_peer [--model smollm2|qwen05b|both] [--rounds 2] [--max-tokens 64]
                                   [--streams 1 4 8] [--eos] [--deterministic] [--cache DIR]

Two models (bench/llm_peer_models.py): SmolLM2-135M-Instruct (Ferry: the int4 default model in
artifacts/models) and a 0.5B-class decoder with Qwen2.5-0.5B's shapes and random weights (Ferry:
`ferry export llm` int4). llama-server, when its binary is present (build it and llama-quantize
with `nice -n 19 tools/build_llama_server.sh`), serves each as a Q4_0 GGUF made from the same
float32 weights, its fastest format on x86 CPUs (its load log's repack lines are printed), with
`--parallel 8 --cont-batching -t 2`. Both get the same prompt token ids (Ferry's rendering of the
chat template), stream, decode greedily for `--max-tokens` tokens (`ignore_eos`, as guidellm and
vLLM's benchmarks ask: with requests ending at their end-of-sequence token, 8 streams decoded 5.5
rows on average on SmolLM2, and "against the bare step at batch 8" measured the prompts' answer
lengths, not the serving; `--eos` lets them stop), and are measured in turns: for
each prompt-cache setting and stream count, llama-server's rounds then Ferry's. Prompt cache off
means `cache_prompt: false` on every llama request and `prefix_cache = false` in Ferry's config.
With it on, every prompt was sent in the cells before: llama-server runs its last token again,
Ferry's prefix cache runs nothing for it (its entry keeps the last position's logits).
`--deterministic` serves Ferry with `batch_invariant = true` (greedy text independent of load).

Prints per model tokens/s and the median time to first token per cell with Ferry / llama ratios,
Ferry against its own bare decode step at a batch of the stream count (bench.llm_int4's step on
the model Ferry serves, in this process, the servers idle: the most a served stream could
decode; measured right before and right after each Ferry cell and averaged, since this shared
box's speed drifts within a run: measured once at the start, the bare step at batch 1 read 71
tok/s where Ferry then served 85), and whether each server's greedy text is identical at every
stream count.
`--ferry-only`: Ferry and its bare step alone, where llama-server is not built. `--py-spy DIR`:
each Ferry cell recorded with py-spy, and its owner thread's time by what it was doing
(bench/owner_profile.py: the forward passes, and what sits between decode steps). Not part of
`make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ferry.bench.llm_int4 import decode_tok_s
from ferry.bench.llm_peer_models import (
    DEFAULT_CACHE,
    LLAMA_QUANTIZE,
    LLAMA_SERVER,
    PeerModel,
    peer_models,
)
from ferry.bench.owner_profile import OwnerProfile, breakdown, describe
from ferry.bench.processes import ManagedProcess, free_port, http_ok, running
from ferry.bench.server_process import ferry_server
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.options import OrtGenAIOptions
from ferry.llm.ortgenai_kv import KVModel

MODELS = {"smollm2": ["smollm2"], "qwen05b": ["qwen05b"], "both": ["smollm2", "qwen05b"]}
QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in two sentences.",
    "List three prime numbers.",
    "Who wrote Hamlet?",
    "Give me a tip for sleeping well.",
    "What is the boiling point of water?",
    "Describe a cat to a child.",
)


@dataclass
class Cell:
    tokens: int = 0
    seconds: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    texts: dict[int, str] = field(default_factory=dict)  # prompt index -> greedy text
    bare_tok_s: float = 0.0  # Ferry's cells: its bare decode step around the cell

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def ttft_ms(self) -> float:
        return 1000 * statistics.median(self.ttft_s) if self.ttft_s else 0.0


class Server:
    """How one server is asked for a streamed greedy completion of token ids."""

    def __init__(self, name: str, url: str, path: str, model: str = "") -> None:
        self.name, self.url, self.path, self.model = name, url, path, model

    def body(self, prompt: list[int], max_tokens: int, cache: bool, ignore_eos: bool) -> dict:
        raise NotImplementedError

    def parse(self, events: list[dict]) -> tuple[str, int]:
        raise NotImplementedError


class FerryServer(Server):
    pid: int | None = None  # its process, for --py-spy

    def body(self, prompt: list[int], max_tokens: int, cache: bool, ignore_eos: bool) -> dict:
        return {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": ignore_eos,  # vLLM's extension, honoured
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def parse(self, events: list[dict]) -> tuple[str, int]:
        text = "".join(c["text"] for e in events for c in e.get("choices", []))
        return text, events[-1]["usage"]["completion_tokens"]


class LlamaServer(Server):
    def body(self, prompt: list[int], max_tokens: int, cache: bool, ignore_eos: bool) -> dict:
        return {
            "prompt": prompt,
            "n_predict": max_tokens,
            "ignore_eos": ignore_eos,
            "temperature": 0,
            "stream": True,
            "cache_prompt": cache,
        }

    def parse(self, events: list[dict]) -> tuple[str, int]:
        text = "".join(e.get("content", "") for e in events)
        counted = sum(1 for e in events if not e.get("stop"))  # one event per token otherwise
        return text, events[-1].get("tokens_predicted", counted)


async def run_cell(
    server: Server,
    prompts: list[list[int]],
    streams: int,
    max_tokens: int,
    cache: bool,
    ignore_eos: bool,
) -> Cell:
    cell = Cell()
    gate = asyncio.Semaphore(streams)

    async def one(client: httpx.AsyncClient, index: int) -> None:
        async with gate:
            sent = time.perf_counter()
            first = None
            chunks = []
            body = server.body(prompts[index], max_tokens, cache, ignore_eos)
            async with client.stream("POST", server.path, json=body) as response:
                response.raise_for_status()
                async for chunk in response.aiter_raw():  # parsed after: the client stays light
                    first = first or time.perf_counter()
                    chunks.append(chunk)
        cell.ttft_s.append((first or time.perf_counter()) - sent)
        events = [
            json.loads(e[6:]) for e in b"".join(chunks).decode().split("\n\n") if e[6:7] == "{"
        ]
        text, tokens = server.parse(events)
        cell.tokens += tokens
        cell.texts[index] = text

    # A new connection per request, for both: llama-server closes a connection after a stream,
    # and a pooled one reused after that fails with "Server disconnected".
    no_reuse = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.url, timeout=300, limits=no_reuse) as client:
        started = time.perf_counter()
        await asyncio.gather(*(one(client, i) for i in range(len(prompts))))
        cell.seconds = time.perf_counter() - started
    return cell


def measure(
    server: Server, prompts: list[list[int]], streams: int, args: argparse.Namespace, cache: bool
) -> Cell:
    total = Cell()
    for _ in range(args.rounds):
        cell = asyncio.run(run_cell(server, prompts, streams, args.max_tokens, cache, not args.eos))
        total.tokens += cell.tokens
        total.seconds += cell.seconds
        total.ttft_s += cell.ttft_s
        total.texts = cell.texts
    return total


def llama_process(gguf: Path, log: Path, threads: int) -> ManagedProcess:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [str(LLAMA_SERVER), "-m", str(gguf), "--port", str(port), "--host", "127.0.0.1"]
    command += ["--parallel", "8", "--cont-batching", "-t", str(threads), "-c", "8192"]
    command += ["-lv", "4"]  # the load log's buffer lines; ~30 lines a request after that
    return ManagedProcess("llama-server", command, log, http_ok(f"{url}/health"), url)


def repack_lines(log: str) -> list[str]:
    """llama.cpp's load log lines about weights repacked for its fast kernels (CPU_REPACK
    buffers; logged at `-lv 4`)."""
    return [line.strip() for line in log.splitlines() if "CPU_REPACK" in line]


def ferry_config(
    model: PeerModel, cache: bool, deterministic: bool = False, spin_us: int = 0
) -> dict:
    return {
        "name": model.name,
        "engine": "ortgenai",
        "path": str(model.ferry_dir),
        "prefix_cache": cache,
        "batch_invariant": deterministic,
        "spin_us": spin_us,
    }


class BareStep:
    """The bare decode step of the model Ferry serves: its own session (llm/ortgenai_kv.KVModel,
    one thread per core, spinning as Ferry's does), no server."""

    def __init__(self, model: PeerModel, steps: int, spin_us: int, rows: int) -> None:
        self._kv = KVModel(model.ferry_dir, 0, spin_us=spin_us)
        self._steps = steps
        decode_tok_s(self._kv, rows, 40, 4)  # first-run allocations and prepacking

    def tok_s(self, batch: int) -> float:
        return decode_tok_s(self._kv, batch, 40, self._steps)[0]


def report(results: dict[tuple[str, bool, int], Cell], args: argparse.Namespace) -> None:
    names = sorted({name for name, _, _ in results}, reverse=True)  # llama, then ferry
    for cache in (False, True):
        print(f"\nprompt cache {'on' if cache else 'off'}:")
        print(f"{'streams':>7} " + " ".join(f"{n + ' tok/s':>17} {'TTFT ms':>8}" for n in names))
        for streams in args.streams:
            cells = [results[(n, cache, streams)] for n in names]
            line = f"{streams:>7} " + " ".join(f"{c.tok_s:17.1f} {c.ttft_ms:8.0f}" for c in cells)
            if len(cells) == 2 and cells[0].tok_s:
                llama, ferry = cells
                line += f"   ferry/llama tok/s {ferry.tok_s / llama.tok_s:.2f}x"
                line += f", TTFT {ferry.ttft_ms / max(llama.ttft_ms, 1e-9):.2f}x"
            ferry = results[("ferry", cache, streams)]
            line += f"; ferry / bare step {ferry.tok_s / ferry.bare_tok_s:.2f}x"
            line += f" ({ferry.bare_tok_s:.0f} tok/s)"
            print(line)
    print("\ngreedy text identical at every stream count (per prompt):")
    for name in names:
        for cache in (False, True):
            runs = [results[(name, cache, s)].texts for s in args.streams]
            same = sum(all(r[i] == runs[0][i] for r in runs) for i in runs[0])
            print(f"  {name}, cache {'on' if cache else 'off'}: {same}/{len(runs[0])}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="both")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of all prompts per cell")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--eos",
        action="store_true",
        help="let a request stop at end-of-sequence (default: every one writes --max-tokens, "
        "ignore_eos on both servers, so N streams decode N rows as the bare step does)",
    )
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--llama-threads", type=int, default=2)
    parser.add_argument("--deterministic", action="store_true", help="Ferry's batch_invariant")
    parser.add_argument(
        "--spin-us",
        type=int,
        default=OrtGenAIOptions.model_fields["spin_us"].default,
        help="Ferry's spin_us, and its bare step's (default: Ferry's default)",
    )
    parser.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help="where built models are kept"
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="record Ferry's cells with py-spy into DIR and print its owner thread's breakdown",
    )
    parser.add_argument(
        "--ferry-only",
        action="store_true",
        help="serve Ferry alone against its bare step (llama-server neither built nor run)",
    )
    args = parser.parse_args(argv)
    with_llama = LLAMA_SERVER.is_file() and LLAMA_QUANTIZE.is_file()
    if not with_llama and not args.ferry_only:
        print(f"llama-server not run: need {LLAMA_SERVER} and {LLAMA_QUANTIZE}")
        sys.exit("build them with: nice -n 19 tools/build_llama_server.sh, or pass --ferry-only")
    with_llama = with_llama and not args.ferry_only
    for model in peer_models(MODELS[args.model], args.cache, gguf=with_llama):
        print(f"\n== {model.name}: Ferry {model.ferry_dir}, llama {model.gguf}", flush=True)
        bare = BareStep(model, args.max_tokens, args.spin_us, max(args.streams))
        report(run_model(model, args, bare), args)


def run_model(
    model: PeerModel, args: argparse.Namespace, bare: BareStep
) -> dict[tuple[str, bool, int], Cell]:
    tokenizer = ChatTokenizer(model.ferry_dir)
    prompts = [tokenizer.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    results: dict[tuple[str, bool, int], Cell] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cache in (False, True):
            config = ferry_config(model, cache, args.deterministic, args.spin_us)
            with ferry_server(models=[], llm_models=[config]) as ferry:
                served = FerryServer("ferry", ferry.url, "/v1/completions", model.name)
                served.pid = ferry.process.pid
                if model.gguf is None:  # --ferry-only
                    _cells([served], prompts, cache, args, results, bare)
                    continue
                log = Path(tmp) / f"llama-{cache}.log"
                with running(llama_process(model.gguf, log, args.llama_threads)) as llama:
                    if not cache:  # the same load log both times
                        repacked = repack_lines(log.read_text(errors="replace"))
                        for line in repacked or ["no repack in its load log: generic kernels"]:
                            print(f"  llama-server: {line}")
                    peers = [LlamaServer("llama", llama.url, "/completion"), served]
                    _cells(peers, prompts, cache, args, results, bare)
    return results


def _cells(peers: list[Server], prompts, cache: bool, args, results, bare: BareStep) -> None:
    for peer in peers:  # warm-up: first-call allocations, and (cache on) the prompts seen once
        asyncio.run(run_cell(peer, prompts, 8, 4, cache, not args.eos))
    for streams in args.streams:
        for peer in peers:  # in turns, on the same prompts
            label = f"{peer.name} cache={'on' if cache else 'off'} streams={streams}"
            pid = getattr(peer, "pid", None)
            ferry = isinstance(peer, FerryServer)  # measured against its bare step around it
            before = bare.tok_s(streams) if ferry else 0.0
            if args.py_spy is None or pid is None:
                cell = measure(peer, prompts, streams, args, cache)
            else:
                args.py_spy.mkdir(parents=True, exist_ok=True)
                path = args.py_spy / f"{label.replace(' ', '-').replace('=', '')}.txt"
                with OwnerProfile(pid, path):
                    cell = measure(peer, prompts, streams, args, cache)
            results[(peer.name, cache, streams)] = cell
            line = f"  {label}: {cell.tok_s:.1f} tok/s, TTFT {cell.ttft_ms:.0f} ms"
            if ferry:
                after = bare.tok_s(streams)
                cell.bare_tok_s = (before + after) / 2
                line += f"; bare step before / after: {before:.0f} / {after:.0f} tok/s"
            print(line, flush=True)
            if args.py_spy is not None and pid is not None:
                print(f"    owner thread (py-spy): {describe(breakdown(path))}", flush=True)


if __name__ == "__main__":
    main()
