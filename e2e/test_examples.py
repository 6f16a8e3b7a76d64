"""The example controllers, run as users run them, against two test-bed clusters."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from testbed import TestBed, wait_for
from testbed.kubectl import Kubectl

ROOT = Path(__file__).resolve().parents[1]


class Example:
    """A running example: its output lines are collected as they come."""

    def __init__(self, name: str, testbed: TestBed, namespace: str) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                f"examples.{name}",
                "--kubeconfig",
                str(testbed.kubeconfig),
                "--contexts",
                ",".join(testbed.clusters),
                "--namespace",
                namespace,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(20)


@pytest.fixture
def run_example(testbed: TestBed, namespace: str):
    started: list[Example] = []

    def start(name: str) -> Example:
        example = Example(name, testbed, namespace)
        started.append(example)
        return example

    yield start
    for example in started:
        code = example.stop()
        assert code == 0, "\n".join(example.lines[-30:])


def test_helloworld_logs_pod_events_of_both_clusters(kubectl: Kubectl, namespace: str, run_example):
    example = run_example("helloworld")
    for context in ("cluster1", "cluster2"):
        kubectl(context, "run", "hello", "-n", namespace, "--image=nginx")
    for context in ("cluster1", "cluster2"):
        wait_for(
            lambda c=context: f"{c} / {namespace} / hello" in example.lines,
            timeout=30,
            what=f"helloworld to log the pod of {context}",
        )


def test_deploymentcopy_copies_updates_and_garbage_collects(
    kubectl: Kubectl, namespace: str, run_example
):
    run_example("deploymentcopy")
    kubectl("cluster1", "create", "deployment", "web", "-n", namespace, "--image=nginx")

    def copy():
        proc = kubectl.run(
            "cluster2", "get", "deployment", "web", "-n", namespace, "-o", "json", check=False
        )
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    copied = wait_for(copy, timeout=30, what="the copy in cluster2")
    annotations = copied["metadata"]["annotations"]
    assert annotations["multicluster.admiralty.io/parent-cluster-name"] == "cluster1"
    original = kubectl.json("cluster1", "get", "deployment", "web", "-n", namespace)
    assert (
        "multicluster.admiralty.io/multiclusterForegroundDeletion"
        in original["metadata"]["finalizers"]
    )

    kubectl("cluster1", "scale", "deployment", "web", "-n", namespace, "--replicas=3")
    wait_for(
        lambda: (copy() or {}).get("spec", {}).get("replicas") == 3,
        timeout=30,
        what="the copy scaled",
    )
    wait_for(
        lambda: (
            kubectl.json("cluster2", "get", "deployment", "web", "-n", namespace)
            .get("status", {})
            .get("readyReplicas")
            == 3
        ),
        timeout=60,
        what="the copy's pods Running in cluster2",
    )

    kubectl("cluster2", "delete", "deployment", "web", "-n", namespace)
    wait_for(copy, timeout=30, what="the deleted copy to be recreated")

    kubectl("cluster1", "delete", "deployment", "web", "-n", namespace, "--timeout=60s")
    assert copy() is None, "the copy went before the original"


def test_podghost_mirrors_pods_and_follows_their_deletion(
    kubectl: Kubectl, namespace: str, run_example
):
    kubectl("cluster2", "apply", "-f", str(ROOT / "examples/podghost/crd.yaml"))
    wait_for(
        lambda: (
            kubectl.run("cluster2", "get", "podghosts", "-n", namespace, check=False).returncode
            == 0
        ),
        timeout=30,
        what="the PodGhost CRD established",
    )
    run_example("podghost")
    kubectl("cluster1", "run", "haunted", "-n", namespace, "--image=nginx")

    def ghost():
        proc = kubectl.run(
            "cluster2", "get", "podghost", "haunted", "-n", namespace, "-o", "json", check=False
        )
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    running = wait_for(
        lambda: (g := ghost()) and g["spec"]["phase"] == "Running" and g,
        timeout=30,
        what="a Running ghost",
    )
    assert running["spec"]["nodeName"].startswith("cluster1-node-")
    assert running["spec"]["containers"] == ["haunted"]
    kubectl("cluster1", "delete", "pod", "haunted", "-n", namespace)
    wait_for(lambda: ghost() is None, timeout=30, what="the ghost to go with its pod")


def test_jobs_run_everywhere_and_report(kubectl: Kubectl, namespace: str, run_example):
    kubectl("cluster1", "apply", "-f", str(ROOT / "examples/jobs/crd.yaml"))
    wait_for(
        lambda: (
            kubectl.run("cluster1", "get", "mcjob", "-n", namespace, check=False).returncode == 0
        ),
        timeout=30,
        what="the MultiClusterJob CRD established",
    )
    run_example("jobs")
    container = {"name": "work", "image": "busybox", "command": ["true"]}
    good = {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}
    # Pods that can never be scheduled, and a deadline: the Jobs fail.
    bad = {
        "activeDeadlineSeconds": 3,
        "backoffLimit": 0,
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"nowhere": "true"},
                "containers": [container],
            }
        },
    }
    for name, template in (("good", good), ("bad", bad)):
        kubectl.apply(
            "cluster1",
            {
                "apiVersion": "examples.multicluster.admiralty.io/v1alpha1",
                "kind": "MultiClusterJob",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"template": template},
            },
        )

    def status(name: str) -> dict:
        return kubectl.json("cluster1", "get", "mcjob", name, "-n", namespace).get("status", {})

    finished = wait_for(
        lambda: status("good").get("phase") == "Finished" and status("good"),
        timeout=60,
        what="the good MultiClusterJob Finished",
    )
    assert finished["clusters"] == {"cluster1": "Complete", "cluster2": "Complete"}
    errored = wait_for(
        lambda: status("bad").get("phase") == "Error" and status("bad"),
        timeout=60,
        what="the bad MultiClusterJob in Error",
    )
    assert set(errored["clusters"].values()) == {"Failed"}
    for context in ("cluster1", "cluster2"):
        job = kubectl.json(context, "get", "job", "good", "-n", namespace)
        assert job["metadata"]["labels"]["multicluster.admiralty.io/parent-uid"]

    kubectl("cluster1", "delete", "mcjob", "good", "-n", namespace, "--timeout=60s")
    for context in ("cluster1", "cluster2"):
        gone = kubectl.run(context, "get", "job", "good", "-n", namespace, check=False)
        assert "NotFound" in gone.stderr
