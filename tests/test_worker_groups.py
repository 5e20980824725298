"""The worker groups (tests/support/worker_groups.py) reach pytest-xdist's scheduler: under
`--dist loadgroup` it reads a test's group from the end of its id. pytest 9.2 stopped reading the
id xdist 3.8 writes the group into, and the tests of one module went round-robin over the
workers, each starting the module's servers (pytest-xdist#1386)."""

from __future__ import annotations

import pytest
from xdist.scheduler.loadgroup import LoadGroupScheduling

from tests.support.worker_groups import name_groups_in_ids

pytestmark = pytest.mark.unit


def test_the_scheduler_reads_each_tests_group_from_its_id(pytester):
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    items = pytester.getitems(
        """
        import pytest

        @pytest.mark.xdist_group("docker")
        @pytest.mark.parametrize("n", [1, 2])
        def test_a(n):
            pass

        @pytest.mark.xdist_group("docker")
        def test_b():
            pass

        def test_c():
            pass
        """
    )
    name_groups_in_ids(items)
    # Only its id parsing: a scheduler with no workers (its __init__ wants them).
    scheduler = LoadGroupScheduling.__new__(LoadGroupScheduling)
    scopes = [scheduler._split_scope(item.nodeid) for item in items]
    assert scopes[:3] == ["docker"] * 3
    assert scopes[3] == items[3].nodeid  # ungrouped: a scope of its own
