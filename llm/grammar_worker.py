"""A grammar checker process: `python -m ferry.llm.grammar_worker '<limits as JSON>'`.

One JSON line in per grammar ({"kind", "text", "tokenizer"}), one JSON line out: {"grammar"}
when it passes, {"error", "bound", "path"} when it is refused. "ready" is written once the
imports are done. A grammar that crashes llguidance ends this process, and only it.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from typing import Any

from ferry.llm.grammar_bounds import GrammarLimits, GrammarRefused
from ferry.llm.grammar_check import GrammarChecker

READY = "ready"


def answer(checker: GrammarChecker, job: dict[str, Any]) -> dict[str, Any]:
    try:
        grammar = checker.check(job["kind"], job["text"], job.get("tokenizer"))
    except GrammarRefused as exc:
        return {"error": str(exc), "bound": exc.bound, "path": list(exc.path)}
    except RecursionError:  # a structure deeper than Python's stack (bounds come first)
        return {"error": "the grammar nests too deeply", "bound": "grammar_max_depth", "path": []}
    return {"grammar": grammar}


# Below the server's own priority: on a busy host a long compile waits, the event loop does not.
NICENESS = 10


def main(argv: list[str]) -> None:
    os.nice(NICENESS)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing grammar leaves no core file
    import llguidance  # noqa: F401  (imported before "ready": the first check is not slower)

    checker = GrammarChecker(GrammarLimits(**json.loads(argv[0])))
    out = sys.stdout
    out.write(READY + "\n")
    out.flush()
    for line in sys.stdin:
        out.write(json.dumps(answer(checker, json.loads(line))) + "\n")
        out.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
