"""The tier plugin (tests/support/tiers.py): a unit test cannot start a process, and a module
declares exactly one tier."""

import asyncio
import multiprocessing
import os
import subprocess
import sys

import pytest

from tests.support.tiers import ProcessStartedInUnitTest

pytestmark = pytest.mark.unit


def start_with_subprocess() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def start_with_multiprocessing() -> None:
    multiprocessing.get_context("spawn").Process(target=print).start()


def start_with_fork() -> None:
    if os.fork() == 0:  # never reached under the guard; a child would leave at once
        os._exit(0)


def start_with_asyncio() -> None:
    async def child() -> None:
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")

    asyncio.run(child())


def run_alone(pytester: pytest.Pytester) -> pytest.RunResult:
    """pytest in this process with the tier plugin alone (pytest-asyncio off: it warns unset)."""
    return pytester.runpytest("-p", "tests.support.tiers", "-p", "no:asyncio")


@pytest.mark.parametrize(
    "start",
    [start_with_subprocess, start_with_multiprocessing, start_with_fork, start_with_asyncio],
)
def test_a_unit_test_that_starts_a_process_fails_naming_itself(start):
    with pytest.raises(ProcessStartedInUnitTest, match=r"\[start_with_\w+\] is in the unit tier"):
        start()


def test_a_unit_tests_fixture_cannot_start_a_process_either(pytester):
    # Setup is guarded too: a session fixture (a server) starts in its first user's setup.
    pytester.makepyfile(
        test_fixture="""
        import subprocess, sys
        import pytest

        pytestmark = pytest.mark.unit

        @pytest.fixture(scope="session")
        def server():
            subprocess.run([sys.executable, "-c", "pass"])

        def test_uses_it(server):
            pass
        """
    )
    result = run_alone(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*test_uses_it is in the unit tier and started a process*"])


@pytest.mark.parametrize(
    ("declaration", "found"),
    [("", "it declares none"), ("[pytest.mark.unit, pytest.mark.system]", "unit, system")],
)
def test_a_module_without_exactly_one_tier_fails_collection(pytester, declaration, found):
    marks = f"pytestmark = {declaration}" if declaration else ""
    pytester.makepyfile(test_tierless=f"import pytest\n{marks}\ndef test_it():\n    pass\n")
    result = run_alone(pytester)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*test_tierless.py: a test module declares exactly one tier*"])
    result.stdout.fnmatch_lines([f"*{found}*"])
