"""How the suite is run: its two phases, and which tests share a worker.

Phases: tests marked ``alone`` (a ratio of two timings, which other load would skew) run after
the others, with nothing else running. ``--phase parallel`` leaves them out (the run on several
workers), ``--phase alone`` runs only them; without ``--phase``, everything runs. ``./dev test``
runs the two phases one after the other (docs/contributing.md).

Workers (``pytest -n N --dist loadgroup``): the tests of an e2e module run on one worker, one
after the other, so that its module-scoped fixtures (an installation of the chart, say) are set
up once; the tests of :data:`SPLIT_MODULES` each on their own, so that their long waits overlap;
those of :data:`REAL_NODE_MODULES` all on one worker, one after the other (real nodes use fixed
paths of this machine); a unit test wherever a worker is free. Groups are handed out in the
order of the collection, which puts the longest first (:data:`LONGEST_FIRST`) and the unit tests
last: they fill the workers' last minutes.
"""

from __future__ import annotations

import pytest

PHASES = ("parallel", "alone")
E2E = "e2e/"
# Modules whose tests run real nodes, or build images on this machine: one at a time.
REAL_NODE_MODULES = ("e2e/test_in_cluster.py", "e2e/test_image.py", "e2e/test_fresh_machine.py")
REAL_NODES = "real-nodes"
# Modules whose tests are independent and long (each waits minutes): one group per test (each
# sets the module's fixtures up again on its worker).
SPLIT_MODULES = ("e2e/test_keepalive.py",)
# The groups that take longest (measured: docs/contributing.md), the longest first.
LONGEST_FIRST = (REAL_NODES, "e2e/test_keepalive.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--phase",
        choices=PHASES,
        help="parallel: every test but those marked alone; alone: only those (default: all)",
    )


def group_of(nodeid: str) -> str:
    """The group of a test, from its node id: tests of one group run on one worker."""
    module = nodeid.split("::", 1)[0]
    if module in REAL_NODE_MODULES:
        return REAL_NODES
    if not module.startswith(E2E) or module in SPLIT_MODULES:
        return nodeid
    return module


def _rank(nodeid: str) -> int:
    """Where a test's group stands in the queue (the collection's order)."""
    if not nodeid.startswith(E2E):
        return len(LONGEST_FIRST) + 1
    group = group_of(nodeid)
    module = nodeid.split("::", 1)[0]
    for i, first in enumerate(LONGEST_FIRST):
        if first in (group, module):
            return i
    return len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _rank(item.nodeid))  # stable: a module keeps its order
    phase = config.getoption("--phase")
    if phase is None:
        return
    wanted = phase == "alone"
    kept = [i for i in items if (i.get_closest_marker("alone") is not None) == wanted]
    dropped = [i for i in items if (i.get_closest_marker("alone") is not None) != wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """With ``--dist loadgroup``: xdist's scheduling by groups, the groups :func:`group_of`
    says (xdist's own ``xdist_group`` markers are not read with pytest 9)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)
