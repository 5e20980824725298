"""schemathesis against the running server's own OpenAPI schema: no 5xx, no schema violations."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.server_process import ferry_server

# Business rules (ids inside the vocabulary, non-blank text) cannot all be written in a JSON
# schema, so "schema-valid request rejected" is not asked for; everything else is.
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
    ]
)


def test_fuzzing_every_endpoint_finds_no_server_error_or_schema_violation():
    st = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "st"
    config = Path(__file__).with_name("schemathesis.toml")
    with ferry_server() as server:
        done = subprocess.run(
            [
                str(st),
                "--config-file",
                str(config),
                "run",
                f"{server.url}/openapi.json",
                "--checks",
                CHECKS,
                "--max-examples",
                "25",
                "--seed",
                "1",
                "--request-timeout",
                "20",
                "--generation-deterministic",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert done.returncode == 0, done.stdout[-6000:]
