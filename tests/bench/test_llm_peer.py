"""bench.llm_peer's bookkeeping: both servers' streams parsed, the table's ratios and the greedy
identity count (the servers themselves run only in the benchmark)."""

from __future__ import annotations

import argparse

import pytest

from ferry.bench.llm_peer import Cell, FerryServer, LlamaServer, repack_lines, report

pytestmark = pytest.mark.unit


def test_both_streams_give_text_and_token_counts() -> None:
    ferry = [
        {"choices": [{"text": "Par"}]},
        {"choices": [{"text": "is"}]},
        {"choices": [], "usage": {"completion_tokens": 2}},
    ]
    assert FerryServer("ferry", "", "").parse(ferry) == ("Paris", 2)
    llama = [{"content": "Par"}, {"content": "is"}, {"content": "", "stop": True}]
    assert LlamaServer("llama", "", "").parse(llama) == ("Paris", 2)
    llama[-1]["tokens_predicted"] = 3
    assert LlamaServer("llama", "", "").parse(llama) == ("Paris", 3)


def test_the_report_gives_ratios_and_counts_identical_greedy_texts(capsys) -> None:
    def cell(tokens: int, seconds: float, ttft: float, texts: dict[int, str], bare=0.0) -> Cell:
        return Cell(tokens, seconds, [ttft], texts, bare)

    results = {}
    for cache in (False, True):
        for streams in (1, 8):
            changed = "b" if streams == 8 and not cache else "a"
            bare = {1: 200.0, 8: 300.0}[streams]  # each Ferry cell's own bare step
            results[("llama", cache, streams)] = cell(100, 1.0, 0.2, {0: "x", 1: "y"})
            results[("ferry", cache, streams)] = cell(150, 1.0, 0.1, {0: "x", 1: changed}, bare)
    report(results, argparse.Namespace(streams=[1, 8]))
    out = capsys.readouterr().out
    assert "ferry/llama tok/s 1.50x, TTFT 0.50x" in out
    assert "ferry / bare step 0.75x" in out and "ferry / bare step 0.50x" in out
    assert "ferry, cache off: 1/2" in out and "ferry, cache on: 2/2" in out
    assert "llama, cache off: 2/2" in out


def test_repack_lines_are_picked_from_llama_servers_load_log() -> None:
    log = (
        "system_info: n_threads = 2 | CPU : AVX512 = 1 | REPACK = 1 |\n"
        "load_tensors:   CPU_Mapped model buffer size =    71.80 MiB\n"
        "load_tensors:   CPU_REPACK model buffer size =    72.14 MiB\n"
    )
    assert repack_lines(log) == ["load_tensors:   CPU_REPACK model buffer size =    72.14 MiB"]
    assert repack_lines("load_tensors:   CPU_Mapped model buffer size = 70 MiB\n") == []


@pytest.mark.parametrize(
    "server", [FerryServer("ferry", "", "", "m"), LlamaServer("llama", "", "")]
)
def test_both_servers_are_asked_to_write_every_token_or_to_stop_at_the_end(server) -> None:
    """Each server's own field (vLLM's extension on Ferry, llama-server's native one)."""
    assert server.body([1, 2], 4, True, True)["ignore_eos"] is True
    assert server.body([1, 2], 4, True, False)["ignore_eos"] is False
