"""A delegate's Events in its target show on its proxy pod (``kubectl describe`` in the source).

The target's own scheduler says where it put the delegate (``Scheduled``); anything else the
target writes about the delegate (here: Events written as its kubelet would) follows, with the
target named, counted rather than repeated, bounded however many come, and only for pods that
are, by uid, delegates of ours.
"""

from __future__ import annotations

import json
import time
import urllib.request

from e2e.scenarios import SOURCE, TARGET
from e2e.test_kubelet_api import POD, delegates_of, placed  # noqa: F401
from testbed import wait_for
from testbed.install import Installation
from testbed.kubectl import Kubectl

PREFIX = "[target c2] "
PROXY_BURST = 25  # delegate_events.PROXY_BURST: what one proxy pod gets before its refill


def reflected(kubectl: Kubectl, namespace: str, proxy: dict) -> list[dict]:
    """The Events on the proxy pod that come from its target."""
    found = kubectl.json(
        SOURCE,
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.uid={proxy['metadata']['uid']}",
    )["items"]
    return [e for e in found if e.get("message", "").startswith(PREFIX)]


def kubelet_event(delegate: dict, name: str, message: str, **fields) -> dict:
    """An Event about ``delegate`` as the target's kubelet writes one."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    meta = delegate["metadata"]
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "type": "Warning",
        "reason": "BackOff",
        "message": message,
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": "kubelet", "host": delegate["spec"].get("nodeName", "")},
    }
    event.update(fields)
    return event


def dropped(installation: Installation) -> float:
    """Events of delegates dropped by the agents of cluster1 (rate limits), all reasons."""
    total = 0.0
    for port in installation.health_ports[SOURCE]:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            for line in answer.read().decode().splitlines():
                if line.startswith("multicluster_scheduler_delegate_events_dropped_total{"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_targets_scheduler_event_and_a_kubelet_event_show_on_the_proxy_pod(
    placed,  # noqa: F811
    kubectl: Kubectl,
):
    namespace, proxy, _ = placed
    [delegate] = delegates_of(kubectl, namespace, proxy)
    # The target's kube-scheduler said where it put the delegate.
    scheduled = wait_for(
        lambda: [e for e in reflected(kubectl, namespace, proxy) if e["reason"] == "Scheduled"],
        30,
        what="the target's Scheduled event on the proxy pod",
    )
    assert scheduled[0]["message"].startswith(f"{PREFIX}Successfully assigned {namespace}/")
    assert scheduled[0]["source"]["host"] == proxy["spec"]["nodeName"]
    # A back-off, as the kubelet there would say it; then said again (count 4).
    message = "Back-off restarting failed container main in pod " + delegate["metadata"]["name"]
    kubectl.apply(TARGET, kubelet_event(delegate, "delegate-backoff", message))

    def backoffs() -> list[dict]:
        return [e for e in reflected(kubectl, namespace, proxy) if e["reason"] == "BackOff"]

    wait_for(backoffs, 30, what="the BackOff event on the proxy pod")
    kubectl(
        TARGET,
        "patch",
        "event",
        "delegate-backoff",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"count": 4}),
    )
    wait_for(lambda: backoffs()[0]["count"] == 4, 30, what="the count raised to 4")
    assert len(backoffs()) == 1
    described = kubectl(SOURCE, "describe", "pod", POD, "-n", namespace)
    print(described[described.index("Events:") :])
    assert f"{PREFIX}{message}" in described
    assert "(x4 over" in described


def test_an_event_naming_a_pod_that_is_not_our_delegate_is_not_reflected(
    placed,  # noqa: F811
    kubectl: Kubectl,
):
    namespace, proxy, _ = placed
    [delegate] = delegates_of(kubectl, namespace, proxy)
    forged = kubelet_event(delegate, "forged-uid", "forged: not about our delegate")
    forged["involvedObject"]["uid"] = "00000000-0000-0000-0000-000000000000"
    kubectl.apply(TARGET, forged)
    bad_type = kubelet_event(delegate, "bad-type", "a type no component writes", type="Fatal")
    kubectl.apply(TARGET, bad_type)
    # An event after them that is reflected: they had their chance to be.
    kubectl.apply(TARGET, kubelet_event(delegate, "genuine", "genuine"))
    wait_for(
        lambda: any(
            e["message"] == f"{PREFIX}genuine" for e in reflected(kubectl, namespace, proxy)
        ),
        30,
        what="the genuine event reflected",
    )
    time.sleep(2)
    messages = [e["message"] for e in reflected(kubectl, namespace, proxy)]
    assert not any("forged" in m or "no component" in m for m in messages), messages


def test_a_burst_of_500_events_yields_a_bounded_number_on_the_proxy_pod(
    placed,  # noqa: F811
    kubectl: Kubectl,
    installation: Installation,
):
    namespace, proxy, _ = placed
    [delegate] = delegates_of(kubectl, namespace, proxy)
    before = dropped(installation)
    burst = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            kubelet_event(delegate, f"burst-{i}", f"burst {i}: readiness probe failed")
            for i in range(500)
        ],
    }
    started = time.monotonic()
    kubectl(TARGET, "create", "-f", "-", stdin=json.dumps(burst), timeout=120)
    created = time.monotonic() - started
    wait_for(lambda: dropped(installation) - before >= 400, 60, what="the excess dropped")
    time.sleep(3)  # anything still to come
    burst_reflected = [
        e for e in reflected(kubectl, namespace, proxy) if e["message"].startswith(f"{PREFIX}burst")
    ]
    print(
        f"500 events created in the target in {created:.1f}s; "
        f"{len(burst_reflected)} reflected, {dropped(installation) - before:.0f} dropped"
    )
    assert 0 < len(burst_reflected) <= PROXY_BURST


def test_after_the_agents_restart_old_events_are_not_replayed_nor_reflected_twice(
    placed,  # noqa: F811
    kubectl: Kubectl,
    installation: Installation,
):
    """Both agents of cluster1 are stopped; meanwhile the target says an event again and writes
    one an hour old. The agent that leads next lists the target's events: the first is written
    again under its name (count 2, still one Event), the old one is history."""
    namespace, proxy, _ = placed
    [delegate] = delegates_of(kubectl, namespace, proxy)
    kubectl.apply(TARGET, kubelet_event(delegate, "said-twice", "said twice"))

    def said_twice() -> list[dict]:
        messages = reflected(kubectl, namespace, proxy)
        return [e for e in messages if e["message"] == f"{PREFIX}said twice"]

    wait_for(said_twice, 30, what="the event reflected")
    agents = installation.agents[SOURCE]
    for agent in agents:
        installation.hold(agent)
    try:
        kubectl(
            TARGET,
            "patch",
            "event",
            "said-twice",
            "-n",
            namespace,
            "--type=merge",
            "-p",
            json.dumps({"count": 2}),
        )
        hour_ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
        old = kubelet_event(
            delegate, "old", "an hour old", firstTimestamp=hour_ago, lastTimestamp=hour_ago
        )
        kubectl.apply(TARGET, old)
    finally:
        for agent in agents:
            installation.release(agent)
    started = time.monotonic()
    wait_for(lambda: said_twice()[0]["count"] == 2, 90, what="the count brought up to date")
    print(f"count brought up to date {time.monotonic() - started:.1f}s after the restart")
    time.sleep(3)
    messages = [e["message"] for e in reflected(kubectl, namespace, proxy)]
    assert len(said_twice()) == 1, messages
    assert f"{PREFIX}an hour old" not in messages
