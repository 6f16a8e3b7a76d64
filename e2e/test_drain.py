"""``kubectl drain`` of a virtual node, as an admin drains a real one: its proxy pods are evicted
through the Eviction API within their PodDisruptionBudget, their delegates deleted from that
target, their replacements placed in the other target; the node stays cordoned and takes no new
proxy pod until it is uncordoned."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest

from e2e.scenarios import (
    SOURCE,
    TARGET,
    PodEvents,
    condition,
    delegates_of,
    finished,
    get,
    job,
    proxies_of,
    ready,
    replicated,
    timed,
)
from testbed import wait_for
from testbed.kubectl import Kubectl

BLOCKED = "Cannot evict pod as it would violate the pod's disruption budget"


@pytest.fixture
def drained(workloads, kubectl: Kubectl):
    """``workloads``; both virtual nodes uncordoned afterwards, whatever happened."""
    yield workloads
    _, nodes = workloads
    for node in nodes:
        kubectl.run(SOURCE, "uncordon", node, check=False)


def budget(name: str, min_available: int) -> dict:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": name}}},
    }


def placement(kubectl: Kubectl, namespace: str) -> Counter[str]:
    """Available proxy pods of the Deployment, by virtual node."""
    return Counter(p["spec"]["nodeName"] for p in ready(proxies_of(kubectl, namespace, "app=web")))


def disruptions_allowed(kubectl: Kubectl, namespace: str) -> int | None:
    return get(kubectl, SOURCE, "pdb", "web", namespace).get("status", {}).get("disruptionsAllowed")


def cordoned(kubectl: Kubectl, node: str) -> bool:
    return kubectl.json(SOURCE, "get", "node", node)["spec"].get("unschedulable") is True


def evicted(events: PodEvents) -> set[str]:
    """Pods that the Eviction API marked before deleting them."""
    return {
        event["object"]["metadata"]["name"]
        for event, _ in events.states()
        for c in event["object"].get("status", {}).get("conditions") or ()
        if c["type"] == "DisruptionTarget" and c.get("reason") == "EvictionByEvictionAPI"
    }


def pending(kubectl: Kubectl, namespace: str) -> list[dict]:
    """Proxy pods of the Deployment that no target takes, and why."""
    return [
        condition(p, "PodScheduled")
        for p in proxies_of(kubectl, namespace, "app=web")
        if condition(p, "PodScheduled").get("reason") == "Unschedulable"
    ]


def test_draining_a_virtual_node_evicts_its_proxy_pods_within_their_budget(
    drained, kubectl: Kubectl, tmp_path: Path
):
    """The other virtual node is cordoned while the drain starts, so that the first replacement
    waits (no target takes it) and the budget blocks the second eviction until it is
    uncordoned: replacements are otherwise Ready within a second, and the API server's own
    retries on a conflict hide the refusal from kubectl."""
    namespace, nodes = drained
    replicas = 4
    kubectl.apply(SOURCE, replicated("Deployment", "web", replicas), "-n", namespace)
    kubectl.apply(SOURCE, budget("web", replicas - 1), "-n", namespace)
    wait_for(
        lambda: sum(placement(kubectl, namespace).values()) == replicas,
        60,
        what="4 replicas Ready",
    )
    wait_for(
        lambda: disruptions_allowed(kubectl, namespace) == 1,
        30,
        what="the budget allowing one disruption",
    )
    # The node with more replicas (2 at least): its second eviction waits for a replacement.
    node, count = placement(kubectl, namespace).most_common(1)[0]
    (other,) = set(nodes) - {node}
    here, there = (SOURCE, TARGET) if node == nodes[0] else (TARGET, SOURCE)
    on_node = {p["metadata"]["name"] for p in proxies_of(kubectl, namespace, "app=web")
               if p["spec"]["nodeName"] == node}  # fmt: skip
    assert count >= 2

    kubectl(SOURCE, "cordon", other)
    log = tmp_path / "drain.log"
    with (
        PodEvents(kubectl, namespace, "app=web") as events,
        timed(f"kubectl drain of a virtual node with {count} of 4 replicas, minAvailable 3"),
        log.open("w") as out,
    ):
        drain = subprocess.Popen(
            [str(kubectl.bin_dir / "kubectl"), "--context", SOURCE, "drain", node,
             "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s"],
            stdout=out, stderr=subprocess.STDOUT, env=kubectl.env(),
        )  # fmt: skip
        try:
            wait_for(lambda: BLOCKED in log.read_text(), 60, what="an eviction refused")
            (waiting,) = pending(kubectl, namespace)
            assert "2 target(s) were unschedulable" in waiting["message"]
            assert disruptions_allowed(kubectl, namespace) == 0
            assert len(ready(proxies_of(kubectl, namespace, "app=web"))) == replicas - 1
            kubectl(SOURCE, "uncordon", other)
            drain.wait(timeout=60)
        finally:
            drain.kill()
    output = log.read_text()
    assert drain.returncode == 0, output
    assert f"node/{node} drained" in output
    assert output.count(f"evicting pod {namespace}/") > count, "the refused eviction retried"
    assert evicted(events) == on_node, "evicted through the Eviction API, all of them"
    fewest, _ = events.extremes()
    assert fewest == replicas - 1, f"{fewest} replicas available at one time, the budget says 3"

    assert cordoned(kubectl, node)
    wait_for(
        lambda: placement(kubectl, namespace) == {other: replicas},
        30,
        what="4 replicas Ready in the other target",
    )
    wait_for(
        lambda: (
            not delegates_of(kubectl, namespace, "app=web")[here]
            and len(delegates_of(kubectl, namespace, "app=web")[there]) == replicas
        ),
        30,
        what=f"the delegates moved from {here} to {there}",
    )

    # Cordoned, it takes no new proxy pod; uncordoned, it does again.
    kubectl(SOURCE, "scale", "deployment", "web", "-n", namespace, "--replicas=6")
    wait_for(lambda: sum(placement(kubectl, namespace).values()) == 6, 60, what="6 replicas Ready")
    assert placement(kubectl, namespace) == {other: 6}
    assert cordoned(kubectl, node), "still cordoned"
    kubectl(SOURCE, "uncordon", node)
    kubectl(SOURCE, "scale", "deployment", "web", "-n", namespace, "--replicas=8")
    wait_for(lambda: sum(placement(kubectl, namespace).values()) == 8, 60, what="8 replicas Ready")
    assert placement(kubectl, namespace)[node] > 0, "the uncordoned node takes proxy pods again"


def test_a_job_ignores_its_pods_drained_off_a_virtual_node_as_its_policy_says(
    drained, kubectl: Kubectl
):
    """A Job with a pod failure policy replaces only pods that have failed (the phase), and a
    rule on the condition DisruptionTarget tells a drain from a failure: an evicted proxy pod
    must end Failed with that condition, as a kubelet leaves an evicted pod, or the Job keeps
    waiting for it (and so does the drain)."""
    namespace, nodes = drained
    policy = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    manifest = job("work", exit_code=None, parallelism=2, completions=2, backoffLimit=0)
    manifest["spec"]["podFailurePolicy"] = policy
    kubectl.apply(SOURCE, manifest, "-n", namespace)
    wait_for(
        lambda: len(ready(proxies_of(kubectl, namespace, "job-name=work"))) == 2,
        60,
        what="2 pods of the Job Running",
    )
    node = proxies_of(kubectl, namespace, "job-name=work")[0]["spec"]["nodeName"]
    (other,) = set(nodes) - {node}
    drained_pods = {p["metadata"]["name"] for p in proxies_of(kubectl, namespace, "job-name=work")
                    if p["spec"]["nodeName"] == node}  # fmt: skip
    with timed("kubectl drain of a virtual node with pods of a Job, the pods replaced"):
        drain = kubectl.run(
            SOURCE, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data",
            "--timeout=60s", check=False, timeout=90,
        )  # fmt: skip
        assert drain.returncode == 0, drain.stdout + drain.stderr
        wait_for(
            lambda: (
                finished(kubectl, namespace, "work")
                or len(ready(proxies_of(kubectl, namespace, "job-name=work"))) == 2
            ),
            60,
            what="2 pods of the Job Running again",
        )
    assert finished(kubectl, namespace, "work") is None, "the drain failed the Job"
    assert not get(kubectl, SOURCE, "job", "work", namespace)["status"].get("failed")
    found = proxies_of(kubectl, namespace, "job-name=work")
    assert not drained_pods & {p["metadata"]["name"] for p in found}
    assert {p["spec"]["nodeName"] for p in found} == {other}
