"""`make mutation`: mutmut over the batcher (batcher, policy, padding, cost model, request,
deadlines) against tests/batcher; prints the score and every surviving mutant that is not listed
as equivalent.

mutmut names a mutant after its file's path and records hits by the importing module's name, so
the code must be imported as `ferry.batcher.x` from `ferry/batcher/x.py`. In the repository
`ferry/batcher` is a symlink to `batcher/`; the run happens in a staging copy (build/mutation)
with real folders, only tests/batcher and a pytest configuration of its own, so mutmut's
`mutants/` and results never touch the repository.

`--survivors` re-tests only the last run's unexplained survivors against the current tests
(after adding tests for them): the staged copy and mutmut's results are kept, so every other
verdict stands; the sources must not have changed since that run.

Exit status: 0 when the score reaches TARGET and every survivor is listed in EQUIVALENT.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGE = REPO / "build" / "mutation"
MODULES = (
    "batcher",
    "admission",
    "collection",
    "dispatch",
    "queue",
    "types",
    "policy",
    "padding",
    "cost_model",
    "request",
    "deadlines",
)
TARGET = 0.85
# Fewer hypothesis examples per mutant (the suite runs 200): the run must finish on 2 cores.
PROPERTY_EXAMPLES = "25"
KILLED = ("killed", "timeout", "segfault")
EQUIVALENT_FILE = Path(__file__).with_name("mutation_equivalents.txt")

PYPROJECT = """
[tool.mutmut]
source_paths = ["ferry/batcher"]
only_mutate = [{only}]
also_copy = ["ferry/__init__.py", "ferry/backends"]
# The broken-batcher tests check the property test itself, not the batcher.
pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-k", "not broken_batcher"]
pytest_add_cli_args_test_selection = ["tests/batcher"]
timeout_multiplier = 10.0
timeout_constant = 5.0

[tool.pytest.ini_options]
asyncio_mode = "auto"
asyncio_default_fixture_loop_scope = "function"
"""


def stage() -> None:
    shutil.rmtree(STAGE, ignore_errors=True)
    (STAGE / "ferry").mkdir(parents=True)
    shutil.copy(REPO / "ferry" / "__init__.py", STAGE / "ferry" / "__init__.py")
    for package in ("batcher", "backends"):
        shutil.copytree(
            REPO / package, STAGE / "ferry" / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    copy_tests()
    only = ", ".join(f'"ferry/batcher/{m}.py"' for m in MODULES)
    (STAGE / "pyproject.toml").write_text(PYPROJECT.format(only=only))


def copy_tests() -> None:
    shutil.rmtree(STAGE / "tests", ignore_errors=True)
    (STAGE / "tests").mkdir()
    (STAGE / "tests" / "__init__.py").write_text("")
    shutil.copytree(
        REPO / "tests" / "batcher",
        STAGE / "tests" / "batcher",
        ignore=shutil.ignore_patterns("__pycache__"),
    )


def equivalents() -> dict[str, str]:
    """mutant name -> one line on why it cannot be killed."""
    listed = {}
    for line in EQUIVALENT_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, why = line.partition(" ")
            listed[name] = why.strip()
    return listed


def results(mutmut: list[str], env: dict[str, str]) -> dict[str, str]:
    """mutant name -> mutmut's verdict, for every mutant of the staged run."""
    out = subprocess.run(
        [*mutmut, "results", "--all", "true"], cwd=STAGE, env=env, capture_output=True, text=True
    ).stdout
    return dict(re.findall(r"^\s*(\S+): (.+)$", out, re.MULTILINE))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--survivors", action="store_true", help="re-test only the last run's unexplained survivors"
    )
    args = parser.parse_args()
    mutmut = [sys.executable, "-m", "mutmut"]
    env = {**os.environ, "FERRY_PROPERTY_EXAMPLES": PROPERTY_EXAMPLES}
    run = [*mutmut, "run", "--max-children", str(args.jobs)]
    if args.survivors:
        if not (STAGE / "mutants").is_dir():
            sys.exit("no earlier run in build/mutation: run `make mutation` first")
        listed = equivalents()
        again = [n for n, s in results(mutmut, env).items() if s not in KILLED and n not in listed]
        copy_tests()
        if again:
            subprocess.run([*run, *again], cwd=STAGE, env=env)
    else:
        stage()
        subprocess.run(run, cwd=STAGE, env=env)
    status = results(mutmut, env)
    killed = sum(1 for s in status.values() if s in KILLED)
    total = len(status)
    listed = equivalents()
    survivors = sorted(name for name, s in status.items() if s not in KILLED)
    unexplained = [name for name in survivors if name not in listed]
    score = killed / total if total else 0.0
    print(f"\nmutation score: {killed}/{total} killed = {score:.1%} (target {TARGET:.0%})")
    print(f"survivors: {len(survivors)} ({len(survivors) - len(unexplained)} listed equivalent)")
    for name in survivors:
        why = listed.get(name)
        print(f"  {name}: {status[name]}" + (f"  [equivalent: {why}]" if why else ""))
        if why is None:
            diff = subprocess.run(
                [*mutmut, "show", name], cwd=STAGE, env=env, capture_output=True, text=True
            )
            print("    " + diff.stdout.strip().replace("\n", "\n    "))
    return 0 if score >= TARGET and not unexplained else 1


if __name__ == "__main__":
    sys.exit(main())
