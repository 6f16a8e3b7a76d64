"""The suite's phases: tests marked ``alone`` (a ratio of two timings, which other load would skew)
run after the others, with nothing else running. ``--phase parallel`` leaves them out (the run
on several workers), ``--phase alone`` runs only them; without ``--phase``, everything runs.
``./dev test`` runs the two phases one after the other (docs/contributing.md)."""

from __future__ import annotations

import pytest

PHASES = ("parallel", "alone")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--phase",
        choices=PHASES,
        help="parallel: every test but those marked alone; alone: only those (default: all)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    phase = config.getoption("--phase")
    if phase is None:
        return
    wanted = phase == "alone"
    kept = [i for i in items if (i.get_closest_marker("alone") is not None) == wanted]
    dropped = [i for i in items if (i.get_closest_marker("alone") is not None) != wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept
