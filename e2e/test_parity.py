"""What Admiralty v0.17 users rely on, on the test bed: a virtual node an admin cordons or taints
takes no new pods (kube-scheduler's NodeUnschedulable and TaintToleration filters, which run
upstream on virtual nodes), and takes them again once uncordoned; a Target's
excludedLabelsRegexp keeps labels off its virtual node; proxy pods' own constraints on virtual
nodes; labels and Service selectors kept unprefixed by no-prefix-label-regexp."""

from __future__ import annotations

import json
import time

from e2e.scenarios import (
    REAL_NODES,
    SOURCE,
    TARGET,
    all_running,
    condition,
    delegates,
    live,
    nginx,
    proxies,
)
from testbed import wait_for
from testbed.kubectl import Kubectl

TAINT = "maintenance=now:NoSchedule"


def placed(kubectl: Kubectl, namespace: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pod in live(proxies(kubectl, namespace)):
        node = pod["spec"].get("nodeName") or ""
        counts[node] = counts.get(node, 0) + 1
    return counts


def pending_messages(kubectl: Kubectl, namespace: str) -> list[str]:
    return [
        condition(p, "PodScheduled").get("message", "")
        for p in live(proxies(kubectl, namespace))
        if not p["spec"].get("nodeName")
    ]


def test_a_cordoned_or_tainted_virtual_node_takes_no_new_pods(guide, kubectl: Kubectl):
    namespace, (c1, c2) = guide
    try:
        kubectl(SOURCE, "cordon", c2)
        kubectl.apply(SOURCE, nginx(6), "-n", namespace)
        wait_for(lambda: all_running(kubectl, namespace, 6), 60, what="6 proxy pods Running")
        assert placed(kubectl, namespace) == {c1: 6}, "none on the cordoned virtual node"
        assert not delegates(kubectl, TARGET, namespace), "nothing created in its target"

        # c2 uncordoned, c1 tainted by an admin: new pods go to c2 only; c1's keep running.
        kubectl(SOURCE, "uncordon", c2)
        kubectl(SOURCE, "taint", "node", c1, TAINT)
        kubectl(SOURCE, "scale", "deployment", "nginx", "-n", namespace, "--replicas=10")
        wait_for(lambda: all_running(kubectl, namespace, 10), 60, what="10 proxy pods Running")
        assert placed(kubectl, namespace) == {c1: 6, c2: 4}

        # Both refused: new pods wait, saying why, and go as soon as one is uncordoned.
        kubectl(SOURCE, "cordon", c2)
        kubectl(SOURCE, "scale", "deployment", "nginx", "-n", namespace, "--replicas=12")
        expected = (
            "0/2 targets are available: 1 target(s) had untolerated taint {maintenance: now}, "
            "1 target(s) were unschedulable."
        )
        wait_for(
            lambda: pending_messages(kubectl, namespace) == [expected] * 2,
            30,
            what="2 pods Pending with the reason",
        )
        uncordoned = time.monotonic()
        kubectl(SOURCE, "uncordon", c2)
        wait_for(lambda: all_running(kubectl, namespace, 12), 60, what="12 proxy pods Running")
        took = time.monotonic() - uncordoned
        assert placed(kubectl, namespace) == {c1: 6, c2: 6}
        print(f"uncordoned: the 2 waiting pods Running {took:.1f} s later")
        assert took < 10, "uncordoning retries waiting pods at once (not after a minute)"
    finally:
        kubectl(SOURCE, "uncordon", c2)
        kubectl(SOURCE, "taint", "node", c1, "maintenance-", check=False)


def node_labels(kubectl: Kubectl, node: str) -> dict[str, str]:
    return kubectl.json(SOURCE, "get", "node", node)["metadata"].get("labels") or {}


def test_labels_a_targets_regexp_matches_stay_off_its_virtual_node(guide, kubectl: Kubectl):
    """spec.excludedLabelsRegexp, as upstream: on key=value, unanchored unless anchored; the
    change applies without a restart; an invalid pattern excludes nothing and says why."""
    namespace, (_, c2) = guide
    azure = "kubernetes.azure.com/cluster"
    labels = [f"{azure}=mc_rg", "tier=gold"]
    kubectl(TARGET, "label", "nodes", "-l", REAL_NODES, *labels, "--overwrite")
    try:
        wait_for(
            lambda: {azure, "tier"} <= set(node_labels(kubectl, c2)),
            30,
            what="the labels all of cluster2's nodes share on its virtual node",
        )

        def exclude(pattern: str) -> None:
            patch = {"spec": {"excludedLabelsRegexp": pattern}}
            kubectl(SOURCE, "patch", "target", "c2", "-n", namespace, "--type=merge",
                    "-p", json.dumps(patch))  # fmt: skip

        exclude(r"^kubernetes\.azure\.com/cluster=")
        started = time.monotonic()
        wait_for(
            lambda: azure not in node_labels(kubectl, c2),
            30,
            what="the excluded label off the virtual node",
        )
        print(f"excluded {time.monotonic() - started:.1f} s after the Target changed")
        assert node_labels(kubectl, c2)["tier"] == "gold", "the others stay"

        exclude("=gold$|(")
        wait_for(
            lambda: {azure, "tier"} <= set(node_labels(kubectl, c2)),
            30,
            what="an invalid pattern excluding nothing",
        )
        events = kubectl.json(
            SOURCE, "get", "events", "-n", namespace,
            "--field-selector", "reason=InvalidExcludedLabelsRegexp",
        )["items"]  # fmt: skip
        assert events, "the Target says why"
        assert "missing )" in events[0]["message"], events[0]["message"]
    finally:
        kubectl(TARGET, "label", "nodes", "-l", REAL_NODES, f"{azure}-", "tier-")


def deployment(name: str, replicas: int, annotations: dict[str, str], spec: dict) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {
                    "labels": {"app": name},
                    "annotations": {"multicluster.admiralty.io/elect": "", **annotations},
                },
                "spec": {
                    "containers": [{"name": "main", "image": "nginx",
                                    "resources": {"requests": {"cpu": "10m"}}}],
                    **spec,
                },
            },
        },
    }  # fmt: skip


def test_what_a_proxy_pod_asks_of_virtual_nodes(guide, kubectl: Kubectl):
    """Upstream's proxy-pod-scheduling-constraints (a PodSpec fragment for the proxy pod, judged
    on virtual nodes' labels) and use-constraints-from-spec-for-proxy-pod-scheduling (the pod's
    own constraints judged on virtual nodes, its delegates free of them)."""
    namespace, (_, c2) = guide
    to_c2 = {"multicluster.admiralty.io/target-name": "c2"}
    kubectl.apply(
        SOURCE,
        deployment(
            "fragment", 4,
            {"multicluster.admiralty.io/proxy-pod-scheduling-constraints":
             json.dumps({"nodeSelector": to_c2})},
            {},
        ),
        "-n", namespace,
    )  # fmt: skip
    kubectl.apply(
        SOURCE,
        deployment(
            "own", 4,
            {"multicluster.admiralty.io/use-constraints-from-spec-for-proxy-pod-scheduling": ""},
            {"nodeSelector": to_c2},
        ),
        "-n", namespace,
    )  # fmt: skip
    wait_for(lambda: all_running(kubectl, namespace, 8), 60, what="8 proxy pods Running")
    assert placed(kubectl, namespace) == {c2: 8}, "every one on c2's virtual node"
    in_c2 = delegates(kubectl, TARGET, namespace)
    assert len(in_c2) == 8
    # The fragment is the proxy pod's only; "own" moved the pod's selector to the proxy pod.
    assert not [d for d in in_c2 if d["spec"].get("nodeSelector")]


def test_labels_the_no_prefix_regexp_matches_reach_delegates_as_they_are(guide, kubectl: Kubectl):
    namespace, _ = guide
    manifest = deployment(
        "queued", 2,
        {"multicluster.admiralty.io/no-prefix-label-regexp": r"^kueue\.x-k8s\.io/queue-name="},
        {},
    )  # fmt: skip
    manifest["spec"]["template"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "q1"
    kubectl.apply(SOURCE, manifest, "-n", namespace)
    wait_for(lambda: all_running(kubectl, namespace, 2), 60, what="2 proxy pods Running")
    found = delegates(kubectl, SOURCE, namespace) + delegates(kubectl, TARGET, namespace)
    assert len(found) == 2
    for delegate in found:
        labels = delegate["metadata"]["labels"]
        assert labels["kueue.x-k8s.io/queue-name"] == "q1", labels
        assert labels["multicluster.admiralty.io/app"] == "queued", "the others prefixed"
        assert "app" not in labels

    # A Service with the same regexp keeps that key of its selector as it is when rerouted.
    regexp = {"multicluster.admiralty.io/no-prefix-label-regexp": r"^kueue\.x-k8s\.io/"}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "queued", "annotations": regexp},
        "spec": {
            "selector": {"app": "queued", "kueue.x-k8s.io/queue-name": "q1"},
            "ports": [{"port": 80}],
        },
    }
    kubectl.apply(SOURCE, service, "-n", namespace)
    rerouted = {"multicluster.admiralty.io/app": "queued", "kueue.x-k8s.io/queue-name": "q1"}

    def selector(context: str) -> dict | None:
        found = kubectl(
            context, "get", "service", "queued", "-n", namespace, "--ignore-not-found",
            "-o", "jsonpath={.spec.selector}",
        )  # fmt: skip
        return json.loads(found) if found else None

    def endpoints() -> set[str]:
        found = set()
        for context in (SOURCE, TARGET):
            text = kubectl(
                context, "get", "endpoints", "queued", "-n", namespace, "--ignore-not-found",
                "-o", "jsonpath={.subsets[*].addresses[*].ip}",
            )  # fmt: skip
            found.update(text.split())
        return found

    wait_for(lambda: selector(SOURCE) == rerouted, 30, what="the Service rerouted")
    wait_for(lambda: selector(TARGET) == rerouted, 30, what="its copy in cluster2")
    ips = {d["status"]["podIP"] for d in found}
    wait_for(lambda: endpoints() == ips, 30, what="endpoints: the delegates, not the proxy pods")

    bad = deployment("bad", 1, {"multicluster.admiralty.io/no-prefix-label-regexp": "("}, {})
    kubectl.apply(SOURCE, bad, "-n", namespace)

    def refused() -> bool:
        sets = kubectl.json(SOURCE, "get", "replicaset", "-n", namespace, "-l", "app=bad")
        return any(
            "no-prefix-label-regexp is not a regular expression" in (c.get("message") or "")
            for rs in sets["items"]
            for c in rs.get("status", {}).get("conditions") or ()
        )

    wait_for(refused, 30, what="the ReplicaSet saying why its pod is refused")
