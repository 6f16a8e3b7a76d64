"""Targets become virtual nodes within seconds, explain every failure, and come and go at run
time: the guide's "Connecting Source and Target Clusters", with RBAC made by hand."""

from __future__ import annotations

import json
import time

import pytest

from e2e.scenarios import disconnect, grant_source, kubeconfig_for, node_ready, secret
from testbed import TestBed, guide, wait_for
from testbed.install import Installation
from testbed.kubectl import Kubectl

SOURCE, TARGET = "cluster1", "cluster2"
PROVIDER = "virtual-kubelet.io/provider=admiralty"


_kubectl: Kubectl | None = None


def unbound_token(namespace: str) -> str:
    """A valid identity in the target that nobody bound to the summary viewer role."""
    assert _kubectl is not None
    _kubectl(TARGET, "create", "serviceaccount", "unbound", "-n", namespace)
    return _kubectl(TARGET, "create", "token", "unbound", "-n", namespace).strip()


def summary_only_token(namespace: str) -> str:
    """An identity in the target that may read summaries but not place pods."""
    assert _kubectl is not None
    _kubectl(TARGET, "create", "serviceaccount", "viewer", "-n", namespace)
    _kubectl(
        TARGET,
        "create",
        "clusterrolebinding",
        f"viewer-{namespace}",
        "--clusterrole=multicluster-scheduler-cluster-summary-viewer",
        f"--serviceaccount={namespace}:viewer",
    )
    return _kubectl(TARGET, "create", "token", "viewer", "-n", namespace).strip()


def ready(kubectl: Kubectl, kind: str, name: str, namespace: str) -> tuple[str, str] | None:
    proc = kubectl.run(SOURCE, "get", kind, name, "-n", namespace, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    for condition in json.loads(proc.stdout).get("status", {}).get("conditions") or ():
        if condition["type"] == "Ready":
            return condition["status"], condition["reason"]
    return None


def node(kubectl: Kubectl, name: str) -> dict | None:
    proc = kubectl.run(SOURCE, "get", "node", name, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


@pytest.fixture
def connected(installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str):
    global _kubectl
    _kubectl = kubectl
    grant_source(kubectl, namespace)
    token = kubectl(TARGET, "create", "token", "c1", "-n", namespace, "--duration=2h").strip()
    kubectl.apply(SOURCE, secret("c2", namespace, {"config": kubeconfig_for(testbed, token)}))
    started = time.monotonic()
    kubectl.apply(SOURCE, guide.targets(namespace))
    yield namespace, token, started
    disconnect(kubectl, namespace)
    kubectl(TARGET, "delete", "clusterrolebinding", f"viewer-{namespace}", "--ignore-not-found")


def test_targets_become_ready_virtual_nodes_within_seconds(
    connected, kubectl: Kubectl, testbed: TestBed
):
    namespace, _, started = connected
    names = [f"admiralty-namespace-{namespace}-c1", f"admiralty-namespace-{namespace}-c2"]
    for name in names:
        wait_for(lambda n=name: node_ready(kubectl, n) == "True", 10, what=f"{name} Ready")
    print(f"virtual nodes Ready {time.monotonic() - started:.1f}s after the Targets")
    listed = kubectl(SOURCE, "get", "node", "-l", PROVIDER, "-o", "name").split()
    assert {f"node/{n}" for n in names} <= set(listed)
    for target in ("c1", "c2"):
        assert ready(kubectl, "target", target, namespace) == ("True", "Ready")
    table = kubectl(SOURCE, "get", "targets", "-n", namespace)
    assert "True" in table
    assert "Ready" in table

    c2 = node(kubectl, names[1])
    assert c2["status"]["allocatable"] == {"cpu": "24", "memory": "96Gi", "pods": "330"}
    labels = c2["metadata"]["labels"]
    assert labels["virtual-kubelet.io/provider"] == "admiralty"
    assert labels["type"] == "virtual-kubelet"
    assert labels["multicluster.admiralty.io/target-name"] == "c2"
    assert labels["multicluster.admiralty.io/target-namespace"] == namespace
    assert c2["spec"]["taints"] == [
        {"key": "virtual-kubelet.io/provider", "value": "admiralty", "effect": "NoSchedule"}
    ]
    kubectl(TARGET, "label", "nodes", "--all", "topology.kubernetes.io/region=eu")
    try:
        wait_for(
            lambda: (
                (node(kubectl, names[1]) or {})["metadata"]["labels"].get(
                    "topology.kubernetes.io/region"
                )
                == "eu"
            ),
            timeout=20,
            what="the target's region label on its virtual node",
        )
    finally:
        kubectl(TARGET, "label", "nodes", "--all", "topology.kubernetes.io/region-")

    kubectl(SOURCE, "delete", "target", "c2", "-n", namespace)
    wait_for(lambda: node(kubectl, names[1]) is None, 15, what="the node of a deleted Target")
    assert node_ready(kubectl, names[0]) == "True"


@pytest.mark.parametrize(
    ("name", "make", "reason"),
    [
        ("missing", lambda ns, tb, token: None, "SecretNotFound"),
        ("nokey", lambda ns, tb, token: secret("nokey", ns, {"other": "x"}), "KeyNotFound"),
        (
            "garbage",
            lambda ns, tb, token: secret("garbage", ns, {"config": "{{{"}),
            "InvalidKubeconfig",
        ),
        (
            "away",
            lambda ns, tb, token: secret(
                "away", ns, {"config": kubeconfig_for(tb, token, "https://127.0.0.1:1")}
            ),
            "Unreachable",
        ),
        (
            "forged",
            lambda ns, tb, token: secret(
                "forged", ns, {"config": kubeconfig_for(tb, "not-a-token")}
            ),
            "Unauthorized",
        ),
        (
            "podless",
            lambda ns, tb, token: secret(
                "podless", ns, {"config": kubeconfig_for(tb, summary_only_token(ns))}
            ),
            "Forbidden",
        ),
    ],
)
def test_broken_targets_say_why_and_others_stay_ready(
    connected, kubectl: Kubectl, testbed: TestBed, name, make, reason
):
    namespace, token, _ = connected
    body = make(namespace, testbed, token)
    if body is not None:
        kubectl.apply(SOURCE, body)
    kubectl.apply(
        SOURCE,
        {
            "apiVersion": "multicluster.admiralty.io/v1alpha1",
            "kind": "Target",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"kubeconfigSecret": {"name": name}},
        },
    )
    wait_for(
        lambda: ready(kubectl, "target", name, namespace) == ("False", reason),
        timeout=10,
        what=f"Ready=False/{reason}",
    )
    message = kubectl(
        SOURCE,
        "get",
        "target",
        name,
        "-n",
        namespace,
        "-o",
        'jsonpath={.status.conditions[?(@.type=="Ready")].message}',
    )
    assert message
    if reason == "Unreachable":  # in words, naming the address
        assert "cannot connect to 127.0.0.1:1: Connect call failed" in message, message
    wait_for(  # written after the condition, on a busy machine a moment later
        lambda: kubectl(
            SOURCE,
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            f"involvedObject.name={name},reason={reason}",
            "-o",
            "name",
        ).strip(),
        timeout=20,
        what="an event saying it too",
    )
    for good in ("c1", "c2"):
        assert ready(kubectl, "target", good, namespace) == ("True", "Ready")

    # Fixing the Secret makes the target Ready, without restarting anything.
    kubectl.apply(SOURCE, secret(name, namespace, {"config": kubeconfig_for(testbed, token)}))
    wait_for(
        lambda: ready(kubectl, "target", name, namespace) == ("True", "Ready"),
        timeout=20,
        what="Ready after the fix",
    )


def test_a_stopped_target_api_server_makes_its_node_not_ready(
    connected, kubectl: Kubectl, testbed: TestBed
):
    namespace, _, _ = connected
    name = f"admiralty-namespace-{namespace}-c2"
    wait_for(lambda: node_ready(kubectl, name) == "True", 15, what="Ready first")
    target = testbed[TARGET]
    target.stop("kube-apiserver")
    stopped = time.monotonic()
    try:
        wait_for(lambda: node_ready(kubectl, name) == "False", 60, what="NotReady")
        print(f"NotReady {time.monotonic() - stopped:.1f}s after the target's API server stopped")
        assert ready(kubectl, "target", "c2", namespace)[1] == "Unreachable"
    finally:
        target.start("kube-apiserver")
        target.wait_settled()
    wait_for(lambda: node_ready(kubectl, name) == "True", 60, what="Ready again")
    taints = {t["key"] for t in node(kubectl, name)["spec"].get("taints") or ()}
    assert "node.kubernetes.io/unreachable" not in taints


def test_cluster_targets_of_the_guide(connected, kubectl: Kubectl, testbed: TestBed):
    namespace, token, _ = connected
    # A ClusterTarget places pods in every namespace: its identity is bound everywhere, as a
    # ClusterSource would bind it.
    kubectl(
        TARGET,
        "create",
        "clusterrolebinding",
        f"everywhere-{namespace}",
        "--clusterrole=multicluster-scheduler-source",
        f"--serviceaccount={namespace}:c1",
    )
    kubectl.apply(SOURCE, secret("c2", "admiralty", {"config": kubeconfig_for(testbed, token)}))
    kubectl.apply(SOURCE, guide.CLUSTER_TARGETS)
    try:
        for name in ("admiralty-cluster-c1", "admiralty-cluster-c2"):
            wait_for(lambda n=name: node_ready(kubectl, n) == "True", 10, what=f"{name} Ready")
        labels = node(kubectl, "admiralty-cluster-c2")["metadata"]["labels"]
        assert labels["multicluster.admiralty.io/cluster-target-name"] == "c2"
        assert "multicluster.admiralty.io/target-namespace" not in labels
        table = kubectl(SOURCE, "get", "ctg")
        assert table.count("Ready") == 2, table
    finally:
        kubectl(SOURCE, "delete", "clustertargets", "c1", "c2", "--ignore-not-found")
        kubectl(TARGET, "delete", "clusterrolebinding", f"everywhere-{namespace}")
        kubectl(SOURCE, "delete", "secret", "c2", "-n", "admiralty", "--ignore-not-found")
    for name in ("admiralty-cluster-c1", "admiralty-cluster-c2"):
        wait_for(lambda n=name: node(kubectl, n) is None, 15, what=f"{name} deleted")
