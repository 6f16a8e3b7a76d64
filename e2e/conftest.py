"""Fixtures for scenarios on the real test bed: one session-wide set of clusters, reused.

Set ``MCS_E2E_CLUSTERS`` (comma-separated names, default ``cluster1,cluster2``) to change them.
Component logs of the run are kept under pytest's temporary folder; when an e2e test fails, the
tail of each one is attached to its report.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from e2e.cluster import ClusterSpec, TestBed
from e2e.kubectl import Kubectl
from e2e.testbin import build

_testbed: TestBed | None = None


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    return build()


@pytest.fixture(scope="session")
def testbed(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> TestBed:
    global _testbed
    names = os.environ.get("MCS_E2E_CLUSTERS", "cluster1,cluster2").split(",")
    directory = tmp_path_factory.mktemp("testbed")
    bed = TestBed([ClusterSpec(name=n.strip()) for n in names], directory, bin_dir)
    bed.up()
    _testbed = bed
    yield bed
    _testbed = None
    bed.down()


@pytest.fixture(scope="session")
def kubectl(testbed: TestBed) -> Kubectl:
    return Kubectl(testbed.kubeconfig, testbed.bin_dir)


@pytest.fixture(scope="module")
def installation(testbed: TestBed):
    """The chart helm-installed into every cluster, agents running under its identity; removed
    after the module (unless a test uninstalled it)."""
    from e2e.cluster.install import Installation

    install = Installation(testbed)
    install.install()
    install.start_agents()
    yield install
    if install.installed:
        install.uninstall()


@pytest.fixture
def namespace(testbed: TestBed, kubectl: Kubectl):
    """A fresh namespace of the same name in every cluster, deleted afterwards."""
    name = f"t{uuid.uuid4().hex[:8]}"  # no dash: virtual node names stay unhashed
    for context in testbed.clusters:
        kubectl(context, "create", "namespace", name)
    yield name
    for context in testbed.clusters:
        kubectl(context, "delete", "namespace", name, "--wait=false")


@pytest.fixture
async def connect(testbed: TestBed):
    """``connect(name)``: a multicluster Cluster for a test-bed context, closed afterwards."""
    from multicluster import Cluster

    made: list[Cluster] = []

    def make(context: str, name: str | None = None, **options) -> Cluster:
        cluster = Cluster.from_kubeconfig(
            name or context, str(testbed.kubeconfig), context, **options
        )
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        await cluster.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and _testbed is not None and "e2e" in item.keywords:
        report.sections.append(("test bed component logs", _testbed.log_tails()))
