"""The user guide, followed literally on the test bed, in its order and with its manifests:
"Connecting Source and Target Clusters" (a Source, the service-account exchange with our
``multicluster-scheduler export`` where the guide pipes ``kubemcsa export``, Targets), the
"Multi-Cluster Deployment in Source Cluster", "Advanced Scheduling" and "Service Reroute and
Globalization"; then the guide's cluster-scoped boxes (a ClusterSource and ClusterTargets).

Each step runs the guide's command line through bash, echoed as ``$ …`` (see it with ``-s``),
with the guide's ``$CLUSTER1``/``$CLUSTER2`` as cluster1/cluster2 and ``$NAMESPACE`` as the test
namespace. What the guide asks the reader to look at is then asserted, from that command's
output where it is a table, else from the objects as JSON (the guide's "-o yaml for details").
Where the test bed cannot do what the guide does (``curl`` into a container: fake nodes run
none), the closest check that proves the same thing stands in, and says so.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e.scenarios import (
    REAL_NODES,
    REGION,
    SOURCE,
    TARGET,
    all_running,
    comparable_spec,
    delegates,
    endpoint_pods,
    nginx,
    nothing_left,
    pods,
    proxies,
    running_and_ready,
    service,
)
from multicluster_scheduler.api.keys import PREFIX
from testbed import guide, wait_for
from testbed.install import NAMESPACE as ADMIRALTY
from testbed.install import Installation
from testbed.kubectl import Kubectl

CLUSTER1, CLUSTER2 = SOURCE, TARGET
ROOT = Path(__file__).resolve().parents[1]
FINALIZER = PREFIX + "multiclusterForegroundDeletion"
VIRTUAL_NODES = "virtual-kubelet.io/provider=admiralty"
ENABLED = "multicluster-scheduler=enabled"


class Shell:
    """Runs a guide command line with bash (pipes as in the guide), echoing it first.

    ``kubectl`` is the test bed's, ``multicluster-scheduler`` the console script installed next
    to this Python (or ``python -m multicluster_scheduler.cli`` where there is none), and
    KUBECONFIG the test bed's: its contexts are named cluster1 and cluster2.
    """

    def __init__(self, kubectl: Kubectl) -> None:
        scripts = Path(sys.executable).parent
        self.env = kubectl.env() | {"PYTHONPATH": str(ROOT)}
        self.env["PATH"] = f"{self.env['PATH']}{os.pathsep}{scripts}"
        self.prelude = "set -o pipefail\n"
        if not (scripts / "multicluster-scheduler").exists():
            python = shlex.quote(sys.executable)
            self.prelude += (
                f'multicluster-scheduler() {{ {python} -m multicluster_scheduler.cli "$@"; }}\n'
            )

    def run(self, command: str, stdin: str | None = None, timeout: float = 120):
        started = time.monotonic()
        proc = subprocess.run(
            ["bash", "-c", self.prelude + command],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )
        heredoc = ""
        if stdin is not None:
            kinds = re.findall(r"^kind: (\S+)\n(?:.*\n)*?  name: (\S+)", stdin, re.M)
            heredoc = " <<EOF  # " + ", ".join(f"{k} {n}" for k, n in kinds)
        print(f"$ {command}{heredoc}  ({time.monotonic() - started:.1f}s)")
        return proc

    def __call__(self, command: str, stdin: str | None = None) -> str:
        proc = self.run(command, stdin)
        print(proc.stdout, end="")
        print(proc.stderr, end="")
        assert proc.returncode == 0, f"{command} exited {proc.returncode}: {proc.stderr}"
        return proc.stdout


@pytest.fixture
def sh(kubectl: Kubectl) -> Shell:
    return Shell(kubectl)


def table(output: str) -> list[dict[str, str]]:
    """Rows of a kubectl table, by column (kubectl aligns cells on the header's columns)."""
    lines = output.splitlines()
    if not lines:
        return []
    columns = [(m.group(), m.start()) for m in re.finditer(r"\S+(?: \S+)*", lines[0])]
    rows = []
    for line in lines[1:]:
        row = {}
        for i, (name, start) in enumerate(columns):
            end = columns[i + 1][1] if i + 1 < len(columns) else None
            row[name] = line[start:end].strip()
        rows.append(row)
    return rows


def virtual_nodes(sh: Shell, names: list[str]) -> dict[str, str]:
    """STATUS of ``names`` in the guide's ``kubectl get node -l …`` (absent ones left out)."""
    out = sh.run(f"kubectl --context {CLUSTER1} get node -l {VIRTUAL_NODES}").stdout
    return {r["NAME"]: r["STATUS"] for r in table(out) if r["NAME"] in names}


def wait_ready(sh: Shell, names: list[str], timeout: float = 30) -> None:
    """The guide's "after a minute, check that virtual nodes … have been created", polled."""
    wait_for(
        lambda: virtual_nodes(sh, names) == dict.fromkeys(names, "Ready"),
        timeout,
        interval=0.5,
        what=f"virtual nodes {names} Ready",
    )
    sh(f"kubectl --context {CLUSTER1} get node -l {VIRTUAL_NODES}")


def gone(kubectl: Kubectl, context: str, *args: str) -> bool:
    return kubectl.run(context, "get", *args, check=False).returncode != 0


def check_deployment(sh: Shell, kubectl: Kubectl, namespace: str, nodes: list[str]) -> None:
    """The guide's "Things to check" after deploying NGINX, from ``kubectl get pods -o wide``
    in both clusters, then the details (``-o yaml``) of each proxy pod and delegate."""
    wait_for(lambda: all_running(kubectl, namespace, 10), 90, what="10 proxy pods Running")
    wait_for(
        lambda: (
            len(
                placed := delegates(kubectl, CLUSTER1, namespace)
                + delegates(kubectl, CLUSTER2, namespace)
            )
            == 10
            and all(running_and_ready(d) for d in placed)
        ),
        30,
        what="10 delegates Running",
    )
    wide = {
        context: table(sh(f"kubectl --context {context} -n {namespace} get pods -o wide"))
        for context in (CLUSTER1, CLUSTER2)
    }
    # 1. The original pods are proxy pods "running" on the virtual nodes…
    on_virtual = [r for r in wide[CLUSTER1] if r["NODE"] in nodes]
    assert len(on_virtual) == 10
    assert {(r["READY"], r["STATUS"]) for r in on_virtual} == {("1/1", "Running")}
    # 2. … and delegates run in either cluster: here in both.
    local = [r for r in wide[CLUSTER1] if r["NODE"] not in nodes]
    remote = wide[CLUSTER2]
    assert local, "some delegates in cluster1 (self target c1)"
    assert remote, "some delegates in cluster2"
    assert len(local) + len(remote) == 10
    assert {(r["READY"], r["STATUS"]) for r in local + remote} == {("1/1", "Running")}
    real = {
        c: set(kubectl(c, "get", "nodes", "-l", REAL_NODES, "-o", "name").split())
        for c in (CLUSTER1, CLUSTER2)
    }
    assert all("node/" + r["NODE"] in real[CLUSTER1] for r in local)
    assert all("node/" + r["NODE"] in real[CLUSTER2] for r in remote)

    # Details: "Notice the original manifest saved as an annotation" and "that their spec
    # matches the original manifest" (minus what docs/reference.md says a delegate drops).
    by_uid = {p["metadata"]["uid"]: p for p in proxies(kubectl, namespace)}
    placed = delegates(kubectl, CLUSTER1, namespace) + delegates(kubectl, CLUSTER2, namespace)
    assert sorted(d["metadata"]["labels"][PREFIX + "parent-uid"] for d in placed) == sorted(
        by_uid
    ), "one delegate per proxy pod"
    for delegate in placed:
        proxy = by_uid[delegate["metadata"]["labels"][PREFIX + "parent-uid"]]
        manifest = json.loads(proxy["metadata"]["annotations"][PREFIX + "sourcepod-manifest"])
        assert manifest["metadata"]["annotations"] == {PREFIX + "elect": ""}
        assert manifest["metadata"]["labels"]["app"] == "nginx"
        assert manifest["spec"]["containers"][0]["image"] == "nginx"
        assert comparable_spec(delegate["spec"]) == comparable_spec(manifest["spec"])
        assert proxy["spec"]["schedulerName"] == "admiralty-proxy"
        assert proxy["spec"]["nodeSelector"] == {"virtual-kubelet.io/provider": "admiralty"}
        assert proxy["metadata"]["finalizers"] == [FINALIZER]
        assert delegate["metadata"]["labels"][PREFIX + "app"] == "nginx"
        annotations = delegate["metadata"]["annotations"]
        assert annotations[PREFIX + "parent-name"] == proxy["metadata"]["name"]
        assert annotations[PREFIX + "parent-namespace"] == namespace


def test_the_user_guide_step_by_step(
    installation: Installation, kubectl: Kubectl, namespace: str, sh: Shell
):
    started = time.monotonic()
    NAMESPACE = namespace  # the guide's $NAMESPACE
    nodes = [f"admiralty-namespace-{NAMESPACE}-c1", f"admiralty-namespace-{NAMESPACE}-c2"]
    try:
        # Connecting Source and Target Clusters, 1. Creating ... Sources in Target Clusters
        assert "source.multicluster.admiralty.io/c1 created" in sh(
            f"kubectl --context {CLUSTER2} apply -f -", stdin=guide.source(NAMESPACE)
        )
        # "If the referred service account doesn't exist, it is created" (by the agent, in a
        # moment: the guide's reader takes longer than that to get to the next command).
        applied = time.monotonic()
        wait_for(
            lambda: not gone(kubectl, CLUSTER2, "serviceaccount", "c1", "-n", NAMESPACE),
            20,
            what="service account c1 made by the source controller",
        )
        print(f"(service account c1 there {time.monotonic() - applied:.1f}s after the Source)")

        # 2. Service Account Exchange: ours where the guide has ./kubemcsa.
        out = sh(
            f"multicluster-scheduler export --context {CLUSTER2} -n {NAMESPACE} c1 --as c2 \\\n"
            f"  | kubectl --context {CLUSTER1} -n {NAMESPACE} apply -f -"
        )
        assert out == "secret/c2 created\n"

        # 3. Creating ... Targets in Source Clusters; then the virtual nodes.
        sh(f"kubectl --context {CLUSTER1} apply -f -", stdin=guide.targets(NAMESPACE))
        wait_ready(sh, nodes)
        connected = time.monotonic()

        # Multi-Cluster Deployment in Source Cluster
        sh(f"kubectl --context {CLUSTER1} label namespace {NAMESPACE} {ENABLED}")
        sh(f"kubectl --context {CLUSTER1} -n {NAMESPACE} apply -f -", stdin=nginx())
        check_deployment(sh, kubectl, NAMESPACE, nodes)
        deployed = time.monotonic()

        # Advanced Scheduling: the box's region labels, then the guide's patch.
        sh(f"kubectl --context {CLUSTER1} get nodes --show-labels")
        sh(f"kubectl --context {CLUSTER2} get nodes --show-labels")
        sh(f"kubectl --context {CLUSTER1} label nodes -l {REAL_NODES} {REGION}=us")
        sh(f"kubectl --context {CLUSTER2} label nodes -l {REAL_NODES} {REGION}=eu")
        patch = {"spec": {"template": {"spec": {"nodeSelector": {REGION: "eu"}}}}}
        sh(
            f"kubectl --context {CLUSTER1} -n {NAMESPACE} patch deployment nginx "
            f"-p {shlex.quote(json.dumps(patch))}"
        )

        # "After a little while, delegate pods in cluster1 (US) will be terminated and more
        # will be created in cluster2 (EU)."
        def moved() -> bool:
            # Every pod, terminating ones too: the old ones are gone from both clusters.
            found = proxies(kubectl, NAMESPACE)
            return (
                len(found) == 10
                and all(running_and_ready(p) and p["spec"]["nodeName"] == nodes[1] for p in found)
                and not pods(kubectl, CLUSTER1, NAMESPACE, "-l", PREFIX + "parent-uid")
                and len(pods(kubectl, CLUSTER2, NAMESPACE)) == 10
                and all(running_and_ready(d) for d in delegates(kubectl, CLUSTER2, NAMESPACE))
            )

        wait_for(moved, 120, what="all delegates in cluster2, none left in cluster1")
        there = table(sh(f"kubectl --context {CLUSTER2} -n {NAMESPACE} get pods -o wide"))
        assert len(there) == 10
        assert {r["STATUS"] for r in there} == {"Running"}
        here = table(sh(f"kubectl --context {CLUSTER1} -n {NAMESPACE} get pods -o wide"))
        assert {r["NODE"] for r in here} == {nodes[1]}, "only proxy pods, all on c2's node"
        moved_at = time.monotonic()

        # Optional: Service Reroute and Globalization
        sh(f"kubectl --context {CLUSTER1} -n {NAMESPACE} expose deployment nginx")

        def rerouted() -> dict | None:
            svc = service(kubectl, CLUSTER1, NAMESPACE, "nginx")
            ok = svc and svc["spec"].get("selector") == {PREFIX + "app": "nginx"}
            return svc if ok else None

        wait_for(rerouted, 30, what="the service rerouted")
        copy = wait_for(
            lambda: service(kubectl, CLUSTER2, NAMESPACE, "nginx"), 30, what="a copy in cluster2"
        )
        # "Check the annotations and the selector, then check that a copy exists in cluster2"
        original = json.loads(
            sh(f"kubectl --context {CLUSTER1} -n {NAMESPACE} get service nginx -o json")
        )
        annotations = original["metadata"]["annotations"]
        assert annotations["io.cilium/global-service"] == "true"
        assert json.loads(annotations[PREFIX + "original-selector"]) == {"app": "nginx"}
        assert original["spec"]["selector"] == {PREFIX + "app": "nginx"}
        copy = json.loads(
            sh(f"kubectl --context {CLUSTER2} -n {NAMESPACE} get service nginx -o json")
        )
        assert copy["metadata"]["annotations"][PREFIX + "is-delegate"] == ""
        assert copy["metadata"]["annotations"]["io.cilium/global-service"] == "true"
        assert copy["spec"]["selector"] == {PREFIX + "app": "nginx"}
        assert copy["spec"]["ports"] == original["spec"]["ports"]
        # "Now call the delegate pods in cluster2 from cluster1": `kubectl run … curl nginx`
        # needs containers and a Cilium cluster mesh, which fake nodes do not have. What that
        # call would reach instead: cluster2's copy lists the delegates there as endpoints
        # (and cluster1's Service, none: no delegate is left there).
        remote = {d["metadata"]["name"] for d in delegates(kubectl, CLUSTER2, NAMESPACE)}
        wait_for(
            lambda: endpoint_pods(kubectl, CLUSTER2, NAMESPACE, "nginx") == remote,
            30,
            what="cluster2's EndpointSlices list the delegates in cluster2",
        )
        sh(
            f"kubectl --context {CLUSTER2} -n {NAMESPACE} get endpointslices "
            f"-l kubernetes.io/service-name=nginx"
        )
        assert endpoint_pods(kubectl, CLUSTER1, NAMESPACE, "nginx") == set()
        served = time.monotonic()

        # Clean up, and nothing left: no proxy, delegate, copy, finalizer, virtual node,
        # binding.
        sh(f"kubectl --context {CLUSTER1} -n {NAMESPACE} delete service nginx --timeout=30s")
        assert service(kubectl, CLUSTER2, NAMESPACE, "nginx") is None, "the copy went first"
        sh(f"kubectl --context {CLUSTER1} -n {NAMESPACE} delete deployment nginx")
        wait_for(lambda: nothing_left(kubectl, NAMESPACE), 60, what="no proxy, no delegate left")
        assert not [
            p["metadata"]["name"]
            for p in pods(kubectl, CLUSTER1, NAMESPACE)
            if p["metadata"].get("finalizers")
        ]
        sh(f"kubectl --context {CLUSTER1} -n {NAMESPACE} delete targets c1 c2 --timeout=30s")
        wait_for(lambda: virtual_nodes(sh, nodes) == {}, 30, what="virtual nodes deleted")
        sh(f"kubectl --context {CLUSTER2} -n {NAMESPACE} delete source c1 --timeout=30s")
        viewer = f"admiralty-source-{NAMESPACE}-c1-cluster-summary-viewer"
        assert gone(kubectl, CLUSTER2, "clusterrolebinding", viewer)
        print(
            f"connected in {connected - started:.1f}s, deployed in {deployed - connected:.1f}s, "
            f"moved to eu in {moved_at - deployed:.1f}s, service in {served - moved_at:.1f}s, "
            f"cleaned up in {time.monotonic() - served:.1f}s"
        )
    finally:
        for context in (CLUSTER1, CLUSTER2):
            kubectl(context, "label", "nodes", "-l", REAL_NODES, f"{REGION}-")
        kubectl(CLUSTER1, "delete", "targets", "--all", "-n", NAMESPACE, "--wait=false")
        kubectl(CLUSTER2, "delete", "sources", "--all", "-n", NAMESPACE, "--wait=false")


CLUSTER_SCOPED_BINDINGS = (
    "admiralty-clustersource-c1",
    "admiralty-clustersource-c1-cluster-summary-viewer",
)


def test_the_user_guides_cluster_scoped_boxes(
    installation: Installation, kubectl: Kubectl, namespace: str, sh: Shell
):
    started = time.monotonic()
    nodes = ["admiralty-cluster-c1", "admiralty-cluster-c2"]
    try:
        # "If you want to allow a source at the cluster scope, create a ClusterSource instead"
        sh(f"kubectl --context {CLUSTER2} apply -f -", stdin=guide.CLUSTER_SOURCE)
        wait_for(
            lambda: not gone(kubectl, CLUSTER2, "serviceaccount", "c1", "-n", ADMIRALTY),
            20,
            what="service account admiralty/c1 made by the source controller",
        )
        # The exchange, into the namespace where the guide's ClusterTarget c2 looks for it.
        out = sh(
            f"multicluster-scheduler export --context {CLUSTER2} -n {ADMIRALTY} c1 --as c2 \\\n"
            f"  | kubectl --context {CLUSTER1} -n {ADMIRALTY} apply -f -"
        )
        assert out == "secret/c2 created\n"
        # "If you want to target clusters at the cluster scope, create ClusterTargets instead"
        sh(f"kubectl --context {CLUSTER1} apply -f -", stdin=guide.CLUSTER_TARGETS)
        wait_ready(sh, nodes)
        connected = time.monotonic()

        # The guide's Deployment, in a fresh namespace (none of it is namespace-specific now).
        sh(f"kubectl --context {CLUSTER1} label namespace {namespace} {ENABLED}")
        sh(f"kubectl --context {CLUSTER1} -n {namespace} apply -f -", stdin=nginx())
        check_deployment(sh, kubectl, namespace, nodes)
        deployed = time.monotonic()

        sh(f"kubectl --context {CLUSTER1} -n {namespace} delete deployment nginx")
        wait_for(lambda: nothing_left(kubectl, namespace), 60, what="no proxy, no delegate left")
        sh(f"kubectl --context {CLUSTER1} delete clustertargets c1 c2 --timeout=30s")
        wait_for(lambda: virtual_nodes(sh, nodes) == {}, 30, what="virtual nodes deleted")
        sh(f"kubectl --context {CLUSTER1} -n {ADMIRALTY} delete secret c2")
        sh(f"kubectl --context {CLUSTER2} delete clustersource c1 --timeout=30s")
        # What the ClusterSource made is owned by it: the garbage collector deletes it.
        wait_for(
            lambda: (
                all(
                    gone(kubectl, CLUSTER2, "clusterrolebinding", b)
                    for b in CLUSTER_SCOPED_BINDINGS
                )
                and gone(kubectl, CLUSTER2, "serviceaccount", "c1", "-n", ADMIRALTY)
            ),
            60,
            what="the ClusterSource's bindings and service account garbage-collected",
        )
        print(
            f"connected in {connected - started:.1f}s, deployed in {deployed - connected:.1f}s, "
            f"cleaned up in {time.monotonic() - deployed:.1f}s"
        )
    finally:
        # Cluster-scoped: whatever happened above, nothing of this test outlives it.
        kubectl(CLUSTER1, "delete", "deployments", "--all", "-n", namespace, "--wait=false")
        kubectl(
            CLUSTER1, "delete", "clustertargets", "c1", "c2", "--ignore-not-found", "--wait=false"
        )
        kubectl(CLUSTER1, "delete", "secret", "c2", "-n", ADMIRALTY, "--ignore-not-found")
        kubectl(CLUSTER2, "delete", "clustersource", "c1", "--ignore-not-found", "--wait=false")
        kubectl(CLUSTER2, "delete", "secret", "c1-token", "-n", ADMIRALTY, "--ignore-not-found")
