"""Test tiers, declared by each test module as `pytestmark = pytest.mark.unit` (or in a list):

- `unit` runs in the test process: starting a process (a subprocess, a multiprocessing child, a
  fork) fails the test, naming it. `make test-fast` runs this tier alone.
- `integration` starts a process: a real server on a socket, a CLI, a child interpreter.
- `system` needs what `make test` installs beside the venv: Docker, Prometheus, Triton,
  perf_analyzer, Chromium, apt packages.

A module that declares no tier, or more than one, fails collection. tests/conftest.py loads this
plugin; a pytester run can load it alone with `-p tests.support.tiers`.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import pytest

TIERS = ("unit", "integration", "system")
# What a process start reaches, whichever API it came through: subprocess (run, Popen, os.popen,
# asyncio's subprocesses) reaches `_execute_child`; multiprocessing (Process, pools, executors)
# reaches `BaseProcess.start`; the os functions start one directly. multiprocessing's own
# resource tracker (shared memory's bookkeeping) is left alone: the library starts it, not the test.
_OS_STARTS = ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp")


class ProcessStartedInUnitTest(RuntimeError):
    """A `unit`-tier test (or a fixture it uses) tried to start a process."""


def module_tier_problem(module: pytest.Module) -> str | None:
    """Why a test module's tier declaration is wrong, or None when it declares exactly one."""
    declared = [mark.name for mark in module.own_markers if mark.name in TIERS]
    if len(declared) == 1:
        return None
    found = f"it declares {', '.join(declared)}" if declared else "it declares none"
    return (
        f"{module.nodeid}: a test module declares exactly one tier, {found}. Add "
        "`pytestmark = pytest.mark.unit` (runs in this process), `pytest.mark.integration` "
        "(starts a process) or `pytest.mark.system` (needs what `make test` installs); "
        "see tests/support/tiers.py."
    )


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    report = yield
    if isinstance(collector, pytest.Module) and report.passed:
        problem = module_tier_problem(collector)
        if problem:
            report.outcome = "failed"
            report.longrepr = problem
            report.result = []
    return report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The tier belongs to the module: a class or function marking another would give two.
    mixed = [
        item.nodeid
        for item in items
        if len([mark for mark in item.iter_markers() if mark.name in TIERS]) != 1
    ]
    if mixed:
        raise pytest.UsageError(
            "a tier is declared once per module (pytestmark), not on a class or test: "
            + ", ".join(mixed)
        )


@contextmanager
def no_process_starts(test: str) -> Iterator[None]:
    """Within the block, any process start raises ProcessStartedInUnitTest naming `test`."""

    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise ProcessStartedInUnitTest(
            f"{test} is in the unit tier and started a process. Keep it in-process, or mark its "
            "module `pytestmark = pytest.mark.integration` (tests/support/tiers.py)."
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", refuse)
        patch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
        for name in _OS_STARTS:
            if hasattr(os, name):
                patch.setattr(os, name, refuse)
        yield


@contextmanager
def _guarded(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("unit") is None:
        yield
    else:
        with no_process_starts(_test_name(item)):
            yield


def _test_name(item: pytest.Item) -> str:
    """The test's id without the `@group` that worker_groups.py appends for xdist's scheduler."""
    mark = item.get_closest_marker("xdist_group")
    return item.nodeid.removesuffix(f"@{mark.args[0]}") if mark else item.nodeid


# Setup as well as the call: a session fixture a unit test asks for (a server) starts during that
# test's setup. Teardown is left out: a shared fixture's teardown runs in whichever test was last.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _guarded(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _guarded(item):
        return (yield)
