"""onnxruntime-genai's own og.Engine driven directly, with no Ferry code: the floor under Ferry's
engine. Greedy, `concurrency` requests in the engine at once, the next admitted as one finishes;
times each token event as it comes out of `Engine.run`."""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

import numpy as np


def og_engine_run(
    model_dir: Path, prompts: list[list[int]], concurrency: int, max_tokens: int
) -> tuple[float, list[tuple[float, list[tuple[float, int]]]]]:
    """(tokens/s over the run, per request: (start time, [(token time, 1), ...]))."""
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(256)
    flags = og.EngineEventFlags

    def begin(ids: list[int]) -> object:
        options = og.RequestOptions()
        options.set_max_session_tokens(len(ids) + max_tokens)
        request = engine.create_request(options=options)
        turn = og.TurnOptions(request)
        turn.set_max_generated_tokens(max_tokens)
        turn.set_do_sample(False)
        request.begin_turn(np.asarray(ids, dtype=np.int32), turn)
        return request

    def run(batch: list[list[int]]) -> list[tuple[float, list[tuple[float, int]]]]:
        waiting, running, done = deque(batch), {}, []
        while waiting or running:
            while waiting and len(running) < concurrency:
                started = time.perf_counter()
                running[begin(waiting.popleft())] = (started, [])
            for event in engine.run(buffer):
                if event.request is None or event.request not in running:
                    continue
                started, times = running[event.request]
                if event.flags & flags.TOKEN:
                    times.append((time.perf_counter(), 1))
                if event.flags & (flags.TURN_FINISHED | flags.FAILED):
                    event.request.close()
                    del running[event.request]
                    done.append((started, times))
        return done

    run(prompts[:2])  # warm-up
    started = time.perf_counter()
    results = run(prompts)
    elapsed = time.perf_counter() - started
    return sum(len(t) for _, t in results) / elapsed, results
