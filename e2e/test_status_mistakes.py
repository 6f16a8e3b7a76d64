"""What ``status`` says about the mistakes that make pods run at home without a word, on the test
bed: Targets in a namespace that is not enabled, a workload whose key is misspelt, and the
chart uninstalled while Targets and elected workloads stay (its last test: it uninstalls)."""

from __future__ import annotations

import json
import time

import pytest

from e2e.scenarios import cli, nginx, proxies
from testbed import TestBed, wait_for
from testbed.install import Installation
from testbed.kubectl import Kubectl

SOURCE, TARGET = "cluster1", "cluster2"
FINALIZER = "multicluster.admiralty.io/multiclusterForegroundDeletion"


def status(testbed: TestBed, namespace: str, *args: str):
    return cli(testbed.kubeconfig, "status", "--context", SOURCE, "-n", namespace, *args)


@pytest.fixture
def joined(installation: Installation, testbed: TestBed, namespace: str) -> str:
    """``namespace`` of cluster1 joined to itself (c1) and to cluster2 (c2); not enabled."""
    for args in (
        ("--target-context", SOURCE, "--target-name", "c1"),
        ("--target-context", TARGET, "--name", "c1", "--target-name", "c2"),
    ):
        done = cli(testbed.kubeconfig, "join", "--source-context", SOURCE, *args, "-n", namespace)
        assert done.returncode == 0, done.stderr
    return namespace


def test_targets_in_a_namespace_that_is_not_enabled(joined: str, testbed, kubectl: Kubectl):
    kubectl.apply(SOURCE, nginx(replicas=3), "-n", joined)
    wait_for(
        lambda: len(kubectl(SOURCE, "get", "pods", "-n", joined, "-o", "name").split()) == 3,
        30,
        what="nginx's 3 pods, here",
    )
    proc = status(testbed, joined)
    assert proc.returncode == 3
    assert f"No proxy pods in namespace {joined}." in proc.stdout
    assert (
        f"namespace {joined} has Targets c1, c2 but is not labelled multicluster-scheduler=enabled"
        f": no pod of it is elected, they all run in this cluster; kubectl label namespace "
        f"{joined} multicluster-scheduler=enabled"
    ) in proc.stdout
    assert (
        "  deployment/nginx: 3 pods carry multicluster.admiralty.io/elect but their namespace is "
        "not labelled multicluster-scheduler=enabled: they run in this cluster"
    ) in proc.stdout
    report = json.loads(status(testbed, joined, "-o", "json").stdout)
    assert [p["reason"] for p in report["problems"]] == ["NamespaceNotEnabled"]
    assert report["ready"] is True  # the targets are; scheduling is not


def test_a_workload_whose_key_is_misspelt(joined: str, testbed, kubectl: Kubectl):
    kubectl(SOURCE, "label", "namespace", joined, "multicluster-scheduler=enabled")
    misspelt = nginx(replicas=2).replace(
        "multicluster.admiralty.io/elect", "multicluster.admiralty/elect"
    )
    kubectl.apply(SOURCE, misspelt, "-n", joined)
    wait_for(
        lambda: len(kubectl(SOURCE, "get", "pods", "-n", joined, "-o", "name").split()) == 2,
        30,
        what="nginx's 2 pods, here",
    )
    proc = status(testbed, joined)
    assert proc.returncode == 3
    assert (
        "  deployment/nginx: 2 pods carry multicluster.admiralty/elect, not "
        "multicluster.admiralty.io/elect: they run in this cluster"
    ) in proc.stdout


def test_after_an_uninstall_no_target_is_ready(
    joined: str, installation: Installation, testbed: TestBed, kubectl: Kubectl
):
    """The CRDs stay, so do the Targets and their last conditions; the webhook configuration and
    the virtual nodes go. What proxy pods then do is what docs/operations.md says."""
    kubectl(SOURCE, "label", "namespace", joined, "multicluster-scheduler=enabled")
    kubectl.apply(SOURCE, nginx(replicas=3), "-n", joined)
    wait_for(
        lambda: sum(p["status"].get("phase") == "Running" for p in proxies(kubectl, joined)) == 3,
        60,
        what="3 proxy pods Running",
    )
    assert status(testbed, joined).returncode == 0
    installation.uninstall()
    try:
        proc = status(testbed, joined)
        assert proc.returncode == 3
        lines = proc.stdout.splitlines()
        assert [line.split()[:3] for line in lines[1:3]] == [
            ["c1", "Unknown", "AgentNotSeen"],
            ["c2", "Unknown", "AgentNotSeen"],
        ]
        assert (
            f"multicluster-scheduler is not installed in context {SOURCE}: no webhook elects pods "
            "and no agent runs"
        ) in proc.stdout
        assert "True" not in " ".join(lines[1:3])

        # What the proxy pods do: held by the finalizer nobody removes, Failed once their node
        # goes, while the ReplicaSet makes ordinary pods in their place.
        started = time.monotonic()
        seen: list[tuple[float, list[str]]] = []

        def settled() -> bool:
            found = proxies(kubectl, joined)
            phases = sorted(p["status"].get("phase", "?") for p in found)
            if not seen or seen[-1][1] != phases:
                seen.append((time.monotonic() - started, phases))
            return bool(found) and all(p == "Failed" for p in phases)

        wait_for(settled, 150, what="proxy pods Failed")
        print("proxy pods after the uninstall (seconds, phases):", seen)
        for pod in proxies(kubectl, joined):
            assert FINALIZER in pod["metadata"]["finalizers"]
        proc = status(testbed, joined)
        assert "  deployment/nginx: 3 pods carry multicluster.admiralty.io/elect but are not " in (
            proc.stdout
        )
    finally:
        kubectl(SOURCE, "delete", "deployment", "nginx", "-n", joined, "--wait=false")
        for pod in proxies(kubectl, joined):
            kubectl(
                SOURCE, "patch", "pod", pod["metadata"]["name"], "-n", joined, "--type=json",
                "-p", json.dumps([{"op": "remove", "path": "/metadata/finalizers"}]),
            )  # fmt: skip
        kubectl(SOURCE, "delete", "targets", "--all", "-n", joined, "--wait=false")
