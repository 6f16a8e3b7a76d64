"""Every module of the test bed and the benchmarks imports: a name moved or renamed in one of
them fails here, in seconds, rather than minutes into an end-to-end run (mypy reads only the
product's packages)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import bench
import testbed


def modules() -> list[str]:
    found = []
    for package in (testbed, bench):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not info.name.endswith(".__main__"):
                found.append(info.name)
    return sorted(found)


@pytest.mark.parametrize("name", modules())
def test_the_module_imports(name: str):
    importlib.import_module(name)
