"""onnxruntime-genai's builder, run as its own command line once per job, several jobs in one
process: importing the builder (torch, transformers, onnx_ir) takes seconds, building a tiny model
a fraction of one.

`python -m ferry.exporters.genai_builder JOBS RESULTS`: JOBS is a JSON list of the builder's
argument lists; RESULTS gets, for each job, null or the failure's traceback and output.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
import traceback
from pathlib import Path

BUILDER = "onnxruntime_genai.models.builder"
# The part of a failed job's output that comes back: the builder prints a line per tensor.
_LOG_TAIL = 3000


def builder_args(
    source: Path, out: Path, precision: str, cache: Path, options: list[str]
) -> list[str]:
    """The builder's command-line arguments for one CPU export."""
    args = ["-i", str(source), "-o", str(out), "-p", precision, "-e", "cpu", "-c", str(cache)]
    return [*args, "--extra_options", *options] if options else args


def run_job(args: list[str]) -> str | None:
    """The builder's `__main__` on `args`, as `python -m` runs it; None, or why it failed."""
    log = io.StringIO()
    argv = sys.argv
    sys.argv = [BUILDER, *args]
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            runpy.run_module(BUILDER, run_name="__main__")
    except SystemExit as exc:  # argparse's refusal of an argument
        if exc.code not in (None, 0):
            return f"{log.getvalue()[-_LOG_TAIL:]}\nexit status {exc.code}"
    except Exception:
        return f"{log.getvalue()[-_LOG_TAIL:]}\n{traceback.format_exc()}"
    finally:
        sys.argv = argv
    return None


def main(jobs_file: str, results_file: str) -> None:
    jobs = json.loads(Path(jobs_file).read_text())
    Path(results_file).write_text(json.dumps([run_job(args) for args in jobs]))


if __name__ == "__main__":
    main(*sys.argv[1:])
