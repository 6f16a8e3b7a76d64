"""Workloads of Kubernetes' built-in controllers with elected pod templates, shared by
e2e/test_workloads.py and e2e/test_drain.py: their manifests, the fixture that deletes them
afterwards, what the tests read of them, and a stopwatch that prints how long each took."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

from e2e.scenarios import SOURCE, TARGET
from e2e.test_scheduling import PREFIX, PROXY_SCHEDULER, pods, running_and_ready
from testbed.kubectl import Kubectl

EXIT_CODE = "testbed.multicluster-scheduler.io/exit-code"  # the test bed's kwok stages
# Kinds the guide fixture does not delete (it deletes deployments, jobs, daemonsets and pods).
MORE_KINDS = ("cronjobs", "statefulsets", "replicasets", "poddisruptionbudgets")


@pytest.fixture(name="workloads")
def workloads_fixture(guide, kubectl: Kubectl):
    """``workloads``: the guide's topology (``guide``, which test modules import as well);
    the workloads of MORE_KINDS are deleted afterwards in both clusters (the guide fixture then
    waits until no proxy pod and no delegate is left)."""
    yield guide
    namespace, _ = guide
    for context in (SOURCE, TARGET):
        for kind in MORE_KINDS:
            kubectl(context, "delete", kind, "--all", "-n", namespace, "--wait=false")


@contextlib.contextmanager
def timed(what: str) -> Iterator[None]:
    """Print the seconds the block took (``pytest -s`` shows them)."""
    started = time.monotonic()
    yield
    print(f"\n{what}: {time.monotonic() - started:.1f} s")


def pod_template(
    labels: dict[str, str] | None = None, exit_code: int | None = None, **spec: Any
) -> dict:
    """An elected pod template with one container ``main``; with ``exit_code``, its pods end
    Succeeded (0) or Failed (1) a second after they run."""
    annotations = {PREFIX + "elect": ""}
    if exit_code is not None:
        annotations[EXIT_CODE] = str(exit_code)
    metadata: dict[str, Any] = {"annotations": annotations}
    if labels:
        metadata["labels"] = labels
    command = ["sleep", "infinity"] if exit_code is None else ["sh", "-c", f"exit {exit_code}"]
    container = {
        "name": "main",
        "image": "busybox",
        "command": command,
        "resources": {"requests": {"cpu": "10m", "memory": "8Mi"}},
    }
    return {"metadata": metadata, "spec": {"containers": [container], **spec}}


def job(name: str, exit_code: int | None = 0, **spec: Any) -> dict:
    """An elected Job (whose pods run until deleted when ``exit_code`` is None); ``spec`` adds
    to the Job's spec (parallelism, completions, …)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "template": pod_template(exit_code=exit_code, restartPolicy="Never"),
            **spec,
        },
    }


def replicated(kind: str, name: str, replicas: int, **spec: Any) -> dict:
    """An elected Deployment, ReplicaSet or StatefulSet whose pods are labelled ``app=name``."""
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": pod_template({"app": name}),
            **spec,
        },
    }


def get(kubectl: Kubectl, context: str, kind: str, name: str, namespace: str) -> dict:
    return kubectl.json(context, "get", kind, name, "-n", namespace)


def finished(kubectl: Kubectl, namespace: str, name: str) -> dict | None:
    """The Job's Complete or Failed condition, once it has one."""
    for c in get(kubectl, SOURCE, "job", name, namespace).get("status", {}).get("conditions") or ():
        if c["type"] in ("Complete", "Failed") and c["status"] == "True":
            return c
    return None


def proxies_of(kubectl: Kubectl, namespace: str, selector: str) -> list[dict]:
    """Proxy pods with these labels (pods the webhook made proxies keep their labels)."""
    return [
        p
        for p in pods(kubectl, SOURCE, namespace, "-l", selector)
        if p["spec"].get("schedulerName") == PROXY_SCHEDULER
    ]


def delegates_of(kubectl: Kubectl, namespace: str, selector: str = "") -> dict[str, list[dict]]:
    """Delegates (not being deleted) in each cluster, by context; ``selector`` is on the user's
    labels, which delegates carry under our prefix (``app=web`` → ``…/app=web``)."""
    terms = [PREFIX + "parent-uid", *(PREFIX + term for term in selector.split(",") if term)]
    return {
        context: [
            d
            for d in pods(kubectl, context, namespace, "-l", ",".join(terms))
            if not d["metadata"].get("deletionTimestamp")
        ]
        for context in (SOURCE, TARGET)
    }


def ready(items: list[dict]) -> list[dict]:
    """Pods that count as available: Running and Ready, and not being deleted."""
    return [p for p in items if running_and_ready(p) and not p["metadata"].get("deletionTimestamp")]


class PodEvents:
    """Every change to the selected pods of cluster1 from now on, in the API server's order: a
    list, then a watch from the list's resourceVersion. Polling misses what lasts less than a
    poll; this misses nothing. A context manager: the watch stops at its end."""

    def __init__(self, kubectl: Kubectl, namespace: str, selector: str) -> None:
        listed = kubectl.json(SOURCE, "get", "pods", "-n", namespace, "-l", selector)
        self.initial = {p["metadata"]["name"]: p for p in listed["items"]}
        query = urlencode(
            {
                "watch": "1",
                "resourceVersion": listed["metadata"]["resourceVersion"],
                "labelSelector": selector,
                "timeoutSeconds": "600",
            }
        )
        self.events: list[dict] = []
        path = f"/api/v1/namespaces/{namespace}/pods?{query}"
        self._watch = subprocess.Popen(
            [str(kubectl.bin_dir / "kubectl"), "--context", SOURCE, "get", "--raw", path],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=kubectl.env(),
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._watch.stdout
        for line in self._watch.stdout:
            if line.strip():
                self.events.append(json.loads(line))

    def __enter__(self) -> PodEvents:
        return self

    def __exit__(self, *_: object) -> None:
        self._watch.terminate()
        self._watch.wait()
        self._reader.join(5)

    def states(self) -> Iterator[tuple[dict, dict[str, dict]]]:
        """Each event so far, with the selected pods (by name) just after it."""
        current = dict(self.initial)
        for event in list(self.events):
            assert event["type"] in ("ADDED", "MODIFIED", "DELETED"), event
            pod = event["object"]
            if event["type"] == "DELETED":
                current.pop(pod["metadata"]["name"], None)
            else:
                current[pod["metadata"]["name"]] = pod
            yield event, current

    def extremes(self) -> tuple[int, int]:
        """The fewest pods available (:func:`ready`) and the most not being deleted, over the
        listed state and every state since."""
        states = [self.initial, *(dict(current) for _, current in self.states())]
        staying = [
            [p for p in s.values() if not p["metadata"].get("deletionTimestamp")] for s in states
        ]
        return min(len(ready(s)) for s in staying), max(len(s) for s in staying)
