"""Start `ferry serve` as a real process on a real socket, for benchmarks and tests."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from ferry.bench.processes import ManagedProcess, free_port, http_ok, running

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL_DIR = REPO / "artifacts" / "models" / "all-MiniLM-L6-v2"
DEFAULT_MODEL = "all-MiniLM-L6-v2"
TINY_LLM_DIR = REPO / "models" / "tiny-llm" / "onnx"
TINY_LLM = "tiny-llm"
# The default chat model, converted by `make model` (ferry export default-llm).
DEFAULT_LLM = "SmolLM2-135M-Instruct"
DEFAULT_LLM_DIR = REPO / "artifacts" / "models" / DEFAULT_LLM
DEFAULT_LLM_HF_DIR = REPO / "artifacts" / "hf" / DEFAULT_LLM


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | Path):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table
        return "{ " + ", ".join(f'"{k}" = {_toml_value(v)}' for k, v in value.items()) + " }"
    return str(value)


def write_config(
    path: Path,
    models: list[dict[str, Any]],
    server: dict[str, Any] | None = None,
    llm_models: list[dict[str, Any]] | None = None,
) -> Path:
    lines = ["[server]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in (server or {}).items()]
    for table, entries in (("models", models), ("llm_models", llm_models or [])):
        for model in entries:
            lines.append(f"\n[[{table}]]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in model.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def default_model_config(
    backend: dict[str, Any] | None = None, batching: dict[str, Any] | None = None, **model: Any
) -> dict[str, Any]:
    """The default model on two ONNX Runtime sessions; `backend` and `batching` entries are
    merged into its tables (a backend of another kind replaces the table)."""
    backend_table: dict[str, Any] = {"kind": "onnxruntime", "sessions": 2}
    if backend is not None:
        same_kind = backend.get("kind", "onnxruntime") == "onnxruntime"
        backend_table = {**backend_table, **backend} if same_kind else dict(backend)
    return {
        "name": DEFAULT_MODEL,
        "path": str(DEFAULT_MODEL_DIR),
        "backend": backend_table,
        "batching": {"max_batch_size": 32, **(batching or {})},
        **model,
    }


@contextlib.contextmanager
def ferry_server(
    models: list[dict[str, Any]] | None = None,
    server: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    # An upper bound only (ready returns at once): a box busy with other work starts a server
    # of many models in over a minute.
    ready_timeout_s: float = 180.0,
    llm_models: list[dict[str, Any]] | None = None,
    module: str = "ferry",  # another entry point with ferry's CLI (bench.null_backend)
    args: Sequence[str] = (),  # more `ferry serve` arguments (--model PATH)
    log_level: str = "warning",
) -> Iterator[FerryProcess]:
    with tempfile.TemporaryDirectory() as tmp:
        config = write_config(
            Path(tmp) / "ferry.toml",
            [default_model_config()] if models is None else models,
            server,
            llm_models,
        )
        handle = FerryProcess(
            config, Path(tmp) / "server.log", module, env, args=args, log_level=log_level
        )
        with running(handle, ready_timeout_s):
            yield handle


class FerryProcess(ManagedProcess):
    """`python -m <module> serve --config <config>` on a free loopback port (or another
    `launcher` of Ferry's CLI, such as an installed `ferry` script)."""

    def __init__(
        self,
        config: Path,
        log_path: Path,
        module: str = "ferry",
        env: dict[str, str] | None = None,
        launcher: Sequence[str] | None = None,
        cwd: Path = REPO,
        args: Sequence[str] = (),
        log_level: str = "warning",
    ) -> None:
        port = free_port()
        command = [*(launcher or (sys.executable, "-m", module)), "serve", "--config", str(config)]
        command += args
        command += ["--port", str(port), "--log-level", log_level]
        api_key = (env or {}).get("FERRY_API_KEY")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        url = f"http://127.0.0.1:{port}"
        super().__init__(
            "ferry",
            command,
            log_path,
            http_ok(f"{url}/health/ready", self.headers),
            url,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            grace_s=30.0,
        )

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", headers=self.headers, timeout=5).text
