"""Fixtures for scenarios on the real test bed: one session-wide set of clusters, reused.

Set ``MCS_E2E_CLUSTERS`` (comma-separated names, default ``cluster1,cluster2``) to change them.
The first one also runs Argo Workflows' controller (e2e/test_argo.py; built on first use, cached).
Component logs of the run are kept under pytest's temporary folder; when an e2e test fails, the
tail of each one is attached to its report.

``real_node_testbed`` is another test bed, for one module at a time: cluster1 and cluster2 with a
real node each (kubelet, containerd, the agent's image and Argo's executor built here; Argo's
controller in cluster1), skipped with the reason where real nodes cannot run.

Run on several workers (``pytest -n N --dist loadgroup``, as ``./dev test`` does), every worker
starts its own test bed when its first e2e test asks for one; which tests share a worker is the
repository's conftest.py's to say.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from e2e import scenarios
from e2e.scenarios import MORE_KINDS, REAL_NODES, REGION, SOURCE, TARGET
from testbed import ClusterSpec, TestBed, wait_for
from testbed.install import Installation
from testbed.kubectl import Kubectl
from testbed.testbin import build

_testbed: TestBed | None = None
_module_testbed: TestBed | None = None


HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    return build()


@pytest.fixture(scope="session")
def testbed(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> TestBed:
    global _testbed
    names = os.environ.get("MCS_E2E_CLUSTERS", "cluster1,cluster2").split(",")
    directory = tmp_path_factory.mktemp("testbed")
    specs = [ClusterSpec(name=n.strip(), argo=i == 0) for i, n in enumerate(names)]
    bed = TestBed(specs, directory, bin_dir, argo_bin=build(group="argo"))
    bed.up()
    _testbed = bed
    yield bed
    _testbed = None
    bed.down()


@pytest.fixture(scope="module")
def real_node_testbed(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """cluster1 (fake nodes in region us) and cluster2 (eu), each with one real node that holds
    the agent's image built here: (the test bed, the image's name). Everything it needs is built
    or installed first when missing (cached). ``bed.machine_before``: this machine's settings
    before the real nodes started (:func:`testbed.host.machine_settings`)."""
    global _module_testbed
    from testbed.host import machine_settings, real_node_blocker
    from testbed.image import build_argoexec_image
    from testbed.realnode import prepare

    blocker = real_node_blocker()
    if blocker:
        pytest.skip(blocker)
    started = time.monotonic()
    setup, image = prepare()
    argoexec = build_argoexec_image()
    setup.images.append(argoexec.archive)
    prepared = time.monotonic()
    specs = [
        ClusterSpec(name="cluster1", node_labels={REGION: "us"}, real_node=True, argo=True),
        ClusterSpec(name="cluster2", node_labels={REGION: "eu"}, real_node=True),
    ]
    bed = TestBed(
        specs,
        tmp_path_factory.mktemp("realnodes"),
        bin_dir,
        real_nodes=setup,
        argo_bin=build(group="argo"),
        argo_executor_image=argoexec.name,
    )
    bed.machine_before = machine_settings()
    bed.up(timeout=300)
    print(
        f"\nreal nodes: set-up {prepared - started:.1f}s (image {image.size / 1e6:.0f} MB), "
        f"two clusters with a real node each up in {time.monotonic() - prepared:.1f}s"
    )
    for cluster in bed.clusters.values():
        node = cluster.real_node
        ready = node.ready_after(cluster.rest.get(f"/api/v1/nodes/{node.name}"))
        print(
            f"{node.name}: Ready {ready:.0f}s after its start, "
            f"images imported in {node.import_seconds:.1f}s"
        )
    _module_testbed = bed
    yield bed, image.name
    _module_testbed = None
    bed.down()


@pytest.fixture(scope="session")
def kubectl(testbed: TestBed) -> Kubectl:
    return Kubectl(testbed.kubeconfig, testbed.bin_dir)


@pytest.fixture(scope="module")
def installation(testbed: TestBed):
    """The chart helm-installed into every cluster, agents running under its identity; removed
    after the module (unless a test uninstalled it)."""
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


@pytest.fixture
def guide(installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str):
    """Targets c1 (self) and c2 Ready in ``namespace``, which is enabled for elected pods."""
    nodes = scenarios.connect(kubectl, testbed, namespace)
    kubectl(SOURCE, "label", "namespace", namespace, "multicluster-scheduler=enabled")
    yield namespace, nodes
    for kind in ("deployments", "jobs", "daemonsets", "pods"):
        kubectl(SOURCE, "delete", kind, "--all", "-n", namespace, "--wait=false")
    try:
        wait_for(
            lambda: scenarios.nothing_left(kubectl, namespace),
            60,
            what="proxies and delegates gone",
        )
    finally:
        scenarios.disconnect(kubectl, namespace)


@pytest.fixture
def regions(kubectl: Kubectl):
    """The guide's region labels: cluster1's nodes in us, cluster2's in eu."""
    kubectl(SOURCE, "label", "nodes", "-l", REAL_NODES, f"{REGION}=us", "--overwrite")
    kubectl(TARGET, "label", "nodes", "-l", REAL_NODES, f"{REGION}=eu", "--overwrite")
    yield
    for context in (SOURCE, TARGET):
        kubectl(context, "label", "nodes", "-l", REAL_NODES, f"{REGION}-")


@pytest.fixture
def workloads(guide, kubectl: Kubectl):
    """The guide's topology (``guide``); the workloads of MORE_KINDS are deleted afterwards in
    both clusters (the guide fixture then waits until no proxy pod and no delegate is left)."""
    yield guide
    namespace, _ = guide
    for context in (SOURCE, TARGET):
        for kind in MORE_KINDS:
            kubectl(context, "delete", kind, "--all", "-n", namespace, "--wait=false")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and "e2e" in item.keywords:
        for bed in (_testbed, _module_testbed):
            if bed is not None:
                report.sections.append((f"component logs of {bed.dir}", bed.log_tails()))
