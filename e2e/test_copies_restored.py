"""Copies deleted by hand in a target come back from the deletion's watch event, within seconds:
a followed ConfigMap and Secret, a Service copy and an Ingress copy. A copy deleted over and
over comes back later and later (the target cannot make us loop), and a copy no longer needed,
or whose original is gone, is not made again."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest

from e2e.scenarios import REGION, SOURCE, TARGET, all_running
from multicluster_scheduler.api.keys import PREFIX
from testbed import TestBed, wait_for
from testbed.install import Installation
from testbed.kubectl import Kubectl

RESTORED_WITHIN = 5.0
STAYS_GONE = 8.0  # longer than a restore takes: a copy not back by then is not coming back

# Where each kind of copy is read (the API path under a namespace), and its name.
COPIES = {
    "configmap": ("api/v1", "configmaps", "settings"),
    "secret": ("api/v1", "secrets", "credentials"),
    "service": ("api/v1", "services", "web"),
    "ingress": ("apis/networking.k8s.io/v1", "ingresses", "web"),
}


@pytest.fixture(scope="module")
def installation(testbed: TestBed):
    """The chart's defaults copy no Ingress until its hosts are allowed (docs/services.md)."""
    install = Installation(testbed, agent_args=("--ingress-allowed-host=*.example.com",))
    install.install()
    install.start_agents()
    yield install
    if install.installed:
        install.uninstall()


def workload(namespace: str) -> str:
    """A Deployment of one elected pod placed in cluster2 (region eu), reading a config map and
    a secret; a Service that selects it (rerouted, made global: copied); an Ingress routing to
    that Service (copied with it: no class, a host the agent allows)."""
    return f"""apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: {namespace}
data:
  GREETING: hello
---
apiVersion: v1
kind: Secret
metadata:
  name: credentials
  namespace: {namespace}
stringData:
  PASSWORD: s3cret
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: {namespace}
spec:
  replicas: 1
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
      annotations:
        multicluster.admiralty.io/elect: ""
    spec:
      nodeSelector:
        {REGION}: eu
      containers:
      - name: web
        image: nginx
        envFrom:
        - configMapRef:
            name: settings
        - secretRef:
            name: credentials
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: {namespace}
spec:
  selector:
    app: web
  ports:
  - port: 80
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  namespace: {namespace}
spec:
  rules:
  - host: web.example.com
    http:
      paths:
      - path: /
        pathType: Prefix
        backend:
          service:
            name: web
            port:
              number: 80
"""


def reader(testbed: TestBed, namespace: str) -> Callable[[str], dict | None]:
    """``read(kind)``: the copy of that kind in cluster2, None if there is none (read straight
    from the API server: a kubectl process per poll would blur the times measured)."""
    rest = testbed[TARGET].rest

    def read(kind: str) -> dict | None:
        group, plural, name = COPIES[kind]
        status, body = rest.request("GET", f"/{group}/namespaces/{namespace}/{plural}/{name}")
        if status == 404:
            return None
        assert status == 200, (status, body[:200])
        return json.loads(body)

    return read


def uid(obj: dict | None) -> str | None:
    return obj["metadata"]["uid"] if obj else None


def delete_and_time(kubectl: Kubectl, read, namespace: str, kind: str) -> float:
    """Delete the copy of ``kind`` in cluster2 with kubectl; seconds until a new copy (a new uid)
    is there, counted from before kubectl starts (an upper bound)."""
    before = uid(read(kind))
    assert before, f"no {kind} copy to delete"
    started = time.monotonic()
    kubectl(TARGET, "delete", kind, COPIES[kind][2], "-n", namespace)
    wait_for(
        lambda: (found := uid(read(kind))) and found != before,
        30,
        interval=0.05,
        what=f"the {kind} copy back",
    )
    return time.monotonic() - started


@pytest.fixture
def copied(guide, regions, testbed: TestBed, kubectl: Kubectl) -> Iterator[tuple[str, Callable]]:
    """The workload in place, each kind of copy in cluster2: (namespace, ``read``)."""
    namespace, _ = guide
    read = reader(testbed, namespace)
    kubectl.apply(SOURCE, workload(namespace))
    wait_for(lambda: all_running(kubectl, namespace, 1), 90, what="the proxy pod Running")
    for kind in COPIES:
        wait_for(lambda kind=kind: read(kind), 30, what=f"the {kind} copied to cluster2")
    yield namespace, read
    # Originals that hold our finalizer go while their targets are still connected.
    kubectl(SOURCE, "delete", "ingresses,services", "--all", "-n", namespace, "--timeout=30s")


def test_each_kind_of_copy_deleted_in_the_target_is_back_within_seconds(copied, kubectl: Kubectl):
    namespace, read = copied

    times = {kind: delete_and_time(kubectl, read, namespace, kind) for kind in COPIES}
    print("\nrestored after deletion: " + ", ".join(f"{k} {t:.2f}s" for k, t in times.items()))
    slow = {k: t for k, t in times.items() if t > RESTORED_WITHIN}
    assert not slow, f"not back within {RESTORED_WITHIN:g}s: {slow}"

    # Deleted again and again (a hostile target, say): each time back later than the last,
    # at 1, 2, 4 s... (the second deletion within five minutes waits 1 s).
    for kind in ("configmap", "service"):
        repeated = [delete_and_time(kubectl, read, namespace, kind) for _ in range(3)]
        print(
            f"{kind} deleted 3 more times, back after: " + ", ".join(f"{t:.2f}s" for t in repeated)
        )
        for waited, at_least in zip(repeated, (1, 2, 4), strict=True):
            assert waited >= at_least - 0.1, repeated
        assert repeated[2] < 4 + RESTORED_WITHIN, repeated


def test_a_copy_no_longer_needed_or_whose_original_is_gone_is_not_made_again(
    copied, kubectl: Kubectl
):
    namespace, read = copied

    # No delegate uses the config map and secret any more; their copies, deleted by hand (or by
    # us meanwhile), stay gone.
    kubectl(SOURCE, "scale", "deployment", "web", "-n", namespace, "--replicas=0")
    wait_for(
        lambda: (
            not kubectl.json(TARGET, "get", "pods", "-n", namespace, "-l", PREFIX + "app=web")[
                "items"
            ]
        ),
        60,
        what="the delegate gone",
    )
    for kind in ("configmap", "secret"):
        kubectl(TARGET, "delete", kind, COPIES[kind][2], "-n", namespace, "--ignore-not-found")
    # The originals of the Ingress and Service copies are deleted: the copies go first, and stay
    # gone.
    kubectl(SOURCE, "delete", "ingress", "web", "-n", namespace, "--timeout=30s")
    kubectl(SOURCE, "delete", "service", "web", "-n", namespace, "--timeout=30s")
    deadline = time.monotonic() + STAYS_GONE
    while time.monotonic() < deadline:
        back = {kind: uid(read(kind)) for kind in COPIES}
        assert not any(back.values()), f"made again: {back}"
        time.sleep(0.5)
