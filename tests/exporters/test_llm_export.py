"""`ferry export llm`: Hugging Face folder in, onnxruntime-genai folder out, greedy parity reported.

Converts the committed tiny Llama (2 layers, seconds) and tiny random sliding-window models
(Gemma2, Mistral-style); the default chat model converted from its GGUF by `make model` is
checked for what serving reads from it.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ferry.bench.server_process import ferry_server
from ferry.exporters import llm_export
from ferry.exporters.cli import add_export_commands
from ferry.exporters.llm_export import ExportError, UnsupportedArchitecture, export_llm
from ferry.exporters.llm_parity import (
    ParityReport,
    PromptParity,
    compare,
    transformers_greedy,
)
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.ortgenai_kv import KVModel
from tests.exporters.tiny_llms import CONTEXT, MATRIX, SLIDING, WINDOW
from tests.llm.llm_paths import HF_DIR, MODEL_NAME

pytestmark = pytest.mark.integration

PARITY_TOKENS = 12


@pytest.fixture(scope="module")
def fp32_export(fp32_exports) -> Path:
    return fp32_exports[MODEL_NAME][1]


def test_fp32_export_is_greedy_identical_to_transformers(fp32_export: Path) -> None:
    report = compare(HF_DIR, fp32_export, "fp32", PARITY_TOKENS)
    assert report.identical, report.describe()
    assert all(
        len(p.expected) == PARITY_TOKENS for p in report.prompts
    )  # no early EOS: a real check


def test_chat_template_and_stop_token_carry_over(fp32_export: Path) -> None:
    source, exported = ChatTokenizer(HF_DIR), ChatTokenizer(fp32_export)
    messages = [{"role": "user", "content": "hi"}]
    assert exported.encode_chat(messages) == source.encode_chat(messages)
    eos_id = json.loads((fp32_export / "genai_config.json").read_text())["model"]["eos_token_id"]
    assert exported.eos_token is not None and exported.encode(exported.eos_token) == [eos_id]


def test_the_default_chat_model_carries_its_template_and_stop_token(default_llm_dir: Path) -> None:
    # Converted from the GGUF by `make model`: SmolLM2's ChatML template with its system prompt,
    # and <|im_end|> as the id generation stops at.
    tokenizer = ChatTokenizer(default_llm_dir)
    prompt = tokenizer.render_chat([{"role": "user", "content": "hi"}])
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    genai = json.loads((default_llm_dir / "genai_config.json").read_text())["model"]
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.encode("<|im_end|>") == [genai["eos_token_id"]]
    # Marked special in tokenizer.json, so a user typing it writes text, not a turn's end:
    # only the system and user turns' own ends are the token.
    ids = tokenizer.encode_chat([{"role": "user", "content": "<|im_end|>"}])
    assert ids.count(genai["eos_token_id"]) == 2


def test_a_gguf_of_an_architecture_transformers_cannot_read_is_named(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "fakearch")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedArchitecture, match="architecture fakearch is not supported"):
        export_llm(tmp_path / "out", "int4", gguf=path)
    assert not (tmp_path / "out").exists()


def test_a_folder_naming_no_architecture_is_refused_before_building(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UnsupportedArchitecture, match="names no architecture"):
        llm_export.build_genai(tmp_path, tmp_path / "out", "int4")
    with pytest.raises(ExportError, match=r"no config\.json"):
        llm_export.build_genai(tmp_path / "missing", tmp_path / "out", "int4")


def test_exactly_one_source_is_taken(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="exactly one"):
        export_llm(tmp_path, "int4")
    with pytest.raises(ExportError, match="exactly one"):
        export_llm(tmp_path, "int4", gguf=tmp_path / "a.gguf", hf=HF_DIR)
    with pytest.raises(ExportError, match="is not a file"):
        export_llm(tmp_path / "out", "int4", gguf=tmp_path / "missing.gguf")


def test_a_lost_chat_template_fails_the_export(fp32_export: Path, tmp_path: Path) -> None:
    broken = shutil.copytree(fp32_export, tmp_path / "copy", ignore=lambda *_: ["model.onnx.data"])
    (broken / "chat_template.jinja").unlink()
    config = json.loads((broken / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (broken / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match="chat template did not carry over"):
        llm_export.check_output(broken)


def test_the_report_counts_tokens_until_the_first_difference() -> None:
    same = PromptParity("a", [1, 2, 3], [1, 2, 3])
    drifts = PromptParity("b", [1, 2, 3, 4], [1, 2, 9, 4])
    report = ParityReport("int4", 4, [same, drifts])
    assert (same.agreeing, drifts.agreeing) == (3, 2)
    assert not report.identical
    assert report.describe().splitlines()[1:] == [
        "  'a': identical",
        "  'b': first 2 of 4 tokens agree",
    ]


def test_cli_names_an_architecture_the_builder_cannot_convert(tmp_path: Path, capsys) -> None:
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert run_cli(["--hf", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "cannot convert GPT2LMHeadModel" in capsys.readouterr().err
    assert run_cli(["--gguf", str(tmp_path / "x.gguf"), "--out", str(tmp_path / "out")]) == 2
    assert "is not a file" in capsys.readouterr().err


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_export_commands(parser.add_subparsers())
    args = parser.parse_args(["export", "llm", *argv])
    return args.handler(args)


@pytest.fixture(scope="module", params=SLIDING)
def sliding_export(request, tiny_llm_exports) -> tuple[str, Path, Path]:
    hf, exported = tiny_llm_exports[request.param]
    return MATRIX[request.param].architecture, hf, exported


@pytest.fixture(scope="module")
def sliding_server(tiny_llm_exports) -> Iterator[tuple[str, dict[Path, str]]]:
    """One server for every sliding-window export (one each took a start of its own): its URL,
    and the name each export is served under."""
    names = {tiny_llm_exports[name][1]: name for name in SLIDING}
    llm_models = [{"name": n, "engine": "ortgenai", "path": str(p)} for p, n in names.items()]
    with ferry_server(models=[], llm_models=llm_models) as server:
        yield server.url, names


def attention_windows(model_dir: Path) -> list[int]:
    import onnx

    graph = onnx.load(str(model_dir / "model.onnx"), load_external_data=False).graph
    return [
        next(a.i for a in node.attribute if a.name == "local_window_size")
        for node in graph.node
        if node.op_type == "GroupQueryAttention"
    ]


def transformers_logits(hf: Path, ids: list[int], **config: int):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32, **config).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def test_sliding_window_models_compute_what_transformers_does(sliding_export) -> None:
    """Full KV caches with the window in the kernel, on the layers transformers windows; the
    batched lane the server decodes with gives transformers' logits past the window."""
    import numpy as np

    arch, hf, exported = sliding_export
    genai = json.loads((exported / "genai_config.json").read_text())["model"]
    assert "sliding_window" not in genai["decoder"]  # no window-sized ring of keys and values
    windowed = {"Gemma2ForCausalLM": [WINDOW, -1], "MistralForCausalLM": [WINDOW, WINDOW]}
    assert attention_windows(exported) == windowed[arch]
    ids = [(7 * i) % 4000 + 5 for i in range(3 * WINDOW)]
    prompt = 2 * WINDOW
    expected = transformers_logits(hf, ids)[prompt - 1 :]
    unwindowed = transformers_logits(hf, ids, sliding_window=CONTEXT)[prompt - 1 :]
    model = KVModel(exported, intra_op_threads=1)
    block = model.new_block(2, 4 * WINDOW)
    # Copies: a run's logits may live in memory the next run reuses.
    got = [model.prefill(block, 0, 0, ids[:prompt]).copy()]
    block.copy_row(block, 0, 1, prompt)  # two rows decode together, as in the server
    for position in range(prompt, len(ids)):
        lengths, tokens = np.array([position] * 2), np.array([ids[position]] * 2)
        got.append(model.decode(block, 2, lengths, tokens)[0].copy())
    error = np.abs(np.stack(got) - expected).max()
    assert error < 1e-3, error
    assert np.abs(unwindowed - expected).max() > 100 * error  # the window matters here


def test_sliding_window_exports_serve_past_the_window(sliding_export, sliding_server) -> None:
    """Served by a real server: greedy text on a prompt three windows long is transformers',
    and a grammar-constrained chat (onnxruntime-genai's Generator lane) answers."""
    _, hf, exported = sliding_export
    url, names = sliding_server
    name = names[exported]
    ids = [(7 * i) % 4000 + 5 for i in range(3 * WINDOW)]
    expected = ChatTokenizer(exported).decode(transformers_greedy(hf, [ids], 8)[0])
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    long_question = " ".join(["def"] * 3 * WINDOW)
    completion = {"model": name, "prompt": ids, "max_tokens": 8, "temperature": 0}
    done = httpx.post(f"{url}/v1/completions", json=completion, timeout=60)
    assert done.status_code == 200, done.text
    assert done.json()["choices"][0]["text"] == expected
    chat = {
        "model": name,
        "messages": [{"role": "user", "content": long_question}],
        "max_tokens": 8,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": schema},
        },
    }
    done = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60)
    assert done.status_code == 200, done.text


def test_a_window_the_export_does_not_apply_is_refused(sliding_export, tmp_path: Path) -> None:
    arch, hf, exported = sliding_export
    config = json.loads((hf / "config.json").read_text())
    narrower = shutil.copytree(hf, tmp_path / "hf", ignore=lambda *_: ["model.safetensors"])
    (narrower / "config.json").write_text(json.dumps({**config, "sliding_window": WINDOW // 2}))
    with pytest.raises(UnsupportedArchitecture, match=f"{arch}: transformers gives its layers"):
        llm_export.check_attention_windows(exported, narrower, arch)


def test_a_failed_check_removes_every_partial_folder(tmp_path: Path) -> None:
    # The builder converts a folder without a chat template; the check after it fails, and so
    # does the export built beside it by the same builder process.
    source = shutil.copytree(HF_DIR, tmp_path / "hf")
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    jobs = [(HF_DIR, tmp_path / "good"), (source, tmp_path / "out")]
    with pytest.raises(ExportError, match="chat template did not carry over"):
        llm_export.build_genai_all(jobs, "fp32")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_a_failed_parity_check_removes_the_partial_folder(tmp_path: Path) -> None:
    seen: list[Path] = []

    def parity(built: Path) -> None:
        seen.append(built)
        assert (built / "genai_config.json").exists()  # runs on the built folder
        raise ExportError("greedy parity against transformers failed: no")

    with pytest.raises(ExportError, match="parity"):
        export_llm(tmp_path / "out", "fp32", hf=HF_DIR, verify=parity)
    assert seen and list(tmp_path.iterdir()) == []
