"""``multicluster-scheduler status`` on the test bed, and the same through the real kubectl as
its plugin ``kubectl multicluster status``: targets joined with ``join`` (one made unreachable,
with its reason), the guide's nginx spread over them with counts that match the pods, a pod
that waits with its reason, ``-o json``, colour on a terminal only, a tenant who may read less,
and errors."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from e2e.scenarios import cli, condition, live, nginx, nothing_left, proxies, running_and_ready
from multicluster_scheduler.api.keys import PREFIX
from testbed import TestBed, wait_for
from testbed.bed import free_ports
from testbed.install import Installation
from testbed.kubectl import Kubectl

SOURCE, TARGET = "cluster1", "cluster2"
NAMESPACE = "web"  # a fixed name: its output is what docs/reference.md shows
ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
STATUS_ARGS = ("multicluster", "status", "--context", SOURCE, "-n", NAMESPACE)
C1, C2, C3 = (f"admiralty-namespace-{NAMESPACE}-{name}" for name in ("c1", "c2", "c3"))


def status(testbed: TestBed, *args: str) -> subprocess.CompletedProcess:
    return cli(testbed.kubeconfig, "status", "--context", SOURCE, *args)


def unreachable_target(kubectl: Kubectl, testbed: TestBed) -> None:
    """Target c3 whose Secret holds a kubeconfig of an address where nothing listens."""
    (port,) = free_ports(1)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c3", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "users": [{"name": "c3", "user": {"token": "nothing"}}],
        "contexts": [{"name": "c3", "context": {"cluster": "c3", "user": "c3"}}],
        "current-context": "c3",
    }
    kubectl.apply(
        SOURCE,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "c3", "namespace": NAMESPACE},
            "stringData": {"config": json.dumps(config)},
        },
    )
    kubectl.apply(
        SOURCE,
        {
            "apiVersion": "multicluster.admiralty.io/v1alpha1",
            "kind": "Target",
            "metadata": {"name": "c3", "namespace": NAMESPACE},
            "spec": {"kubeconfigSecret": {"name": "c3"}},
        },
    )


def target_reason(kubectl: Kubectl, name: str) -> str | None:
    found = kubectl.json(SOURCE, "get", "target", name, "-n", NAMESPACE)
    for c in found.get("status", {}).get("conditions") or ():
        if c["type"] == "Ready":
            return c["reason"]
    return None


def picky_message(kubectl: Kubectl) -> str:
    pod = kubectl.json(SOURCE, "get", "pod", "picky", "-n", NAMESPACE)
    return condition(pod, "PodScheduled").get("message", "")


PICKY = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "picky", "annotations": {PREFIX + "elect": ""}},
    "spec": {
        "nodeSelector": {"e2e.multicluster-scheduler.io/pool": "gpu"},
        "containers": [{"name": "main", "image": "busybox"}],
    },
}


@pytest.fixture(scope="module")
def scene(installation: Installation, testbed: TestBed, kubectl: Kubectl):
    """Namespace web of cluster1 joined to c1 (itself) and c2 (cluster2) by ``join``, enabled,
    with the guide's nginx (10 replicas) Running and a pod that no target can take."""
    for context in (SOURCE, TARGET):
        kubectl(context, "create", "namespace", NAMESPACE)
    for args in (
        ("--target-context", SOURCE, "--target-name", "c1"),
        ("--target-context", TARGET, "--name", "c1", "--target-name", "c2"),
    ):
        joined = cli(testbed.kubeconfig, "join", "--source-context", SOURCE, *args, "-n", NAMESPACE)
        assert joined.returncode == 0, joined.stderr
    yield
    for kind in ("deployments", "pods"):
        kubectl(SOURCE, "delete", kind, "--all", "-n", NAMESPACE, "--wait=false")
    try:
        wait_for(lambda: nothing_left(kubectl, NAMESPACE), 60, what="proxies and delegates gone")
    finally:
        kubectl(SOURCE, "delete", "targets", "--all", "-n", NAMESPACE, "--wait=false")
        for context in (SOURCE, TARGET):
            kubectl(context, "delete", "namespace", NAMESPACE, "--wait=false")


def test_joined_targets_are_ready_and_nothing_runs_yet(scene, testbed: TestBed):
    """Ready, but the namespace is not enabled yet: nothing would be elected, and status says
    so (exit code 3)."""
    proc = status(testbed, "-n", NAMESPACE)
    assert proc.returncode == 3, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:5] == ["TARGET", "READY", "REASON", "VIRTUAL", "NODE"]
    assert [line.split()[:5] for line in lines[1:3]] == [
        ["c1", "True", "Ready", C1, "Ready"],
        ["c2", "True", "Ready", C2, "Ready"],
    ]
    assert lines[3:] == [
        "",
        f"No proxy pods in namespace {NAMESPACE}.",
        "",
        f"namespace {NAMESPACE} has Targets c1, c2 but is not labelled "
        "multicluster-scheduler=enabled: no pod of it is elected, they all run in this cluster; "
        f"kubectl label namespace {NAMESPACE} multicluster-scheduler=enabled",
    ]


def test_a_spread_deployment_a_waiting_pod_and_an_unreachable_target(
    scene, testbed: TestBed, kubectl: Kubectl
):
    kubectl(SOURCE, "label", "namespace", NAMESPACE, "multicluster-scheduler=enabled")
    kubectl.apply(SOURCE, nginx(), "-n", NAMESPACE)
    kubectl.apply(SOURCE, PICKY, "-n", NAMESPACE)

    def settled() -> bool:
        found = live(proxies(kubectl, NAMESPACE))
        nginxes = [p for p in found if p["metadata"]["name"].startswith("nginx-")]
        picky = [p for p in found if p["metadata"]["name"] == "picky"]
        return (
            len(nginxes) == 10
            and all(running_and_ready(p) for p in nginxes)
            and len(picky) == 1
            and condition(picky[0], "PodScheduled").get("reason") == "Unschedulable"
        )

    wait_for(settled, 90, what="nginx Running and picky Unschedulable")
    unreachable_target(kubectl, testbed)
    wait_for(lambda: target_reason(kubectl, "c3") == "Unreachable", 30, what="c3 Unreachable")
    wait_for(
        lambda: picky_message(kubectl).startswith("0/3 targets are available"),
        30,
        what="picky's message to count c3",
    )

    # What the pods say, read with kubectl: the truth the report must match.
    pods = live(proxies(kubectl, NAMESPACE))
    per_node: dict[str, int] = {}
    for pod in pods:
        if pod["spec"].get("nodeName"):
            per_node[pod["spec"]["nodeName"]] = per_node.get(pod["spec"]["nodeName"], 0) + 1
    assert set(per_node) == {C1, C2}, "nginx spread over both targets"
    pending_reason = picky_message(kubectl)
    c3_message = kubectl.json(SOURCE, "get", "target", "c3", "-n", NAMESPACE)["status"][
        "conditions"
    ][0]["message"]

    started = time.monotonic()
    proc = status(testbed, "-n", NAMESPACE)
    print(f"status took {time.monotonic() - started:.1f}s")
    assert proc.returncode == 3, "some target is not Ready"
    assert proc.stderr == ""
    assert "\033[" not in proc.stdout, "no colour into a pipe"
    lines = proc.stdout.splitlines()
    assert [line.split()[:5] for line in lines[1:4]] == [
        ["c1", "True", "Ready", C1, "Ready"],
        ["c2", "True", "Ready", C2, "Ready"],
        ["c3", "False", "Unreachable", C3, "NotReady"],
    ]
    for line, node in zip(lines[1:3], (C1, C2), strict=True):
        cpu, _, pods_used = line.split()[5:8]
        assert cpu.split("/")[0] == f"{100 * per_node[node]}m"
        assert pods_used.split("/")[0] == str(per_node[node])
    assert lines[4].startswith(f"Target {NAMESPACE}/c3 is not Ready (Unreachable): {c3_message}")
    workloads = lines[lines.index("") + 1 :]
    assert workloads[0].split() == ["WORKLOAD", "PODS", "PLACED", "PENDING", "REASON"]
    placed = f"c1={per_node[C1]},c2={per_node[C2]}"
    assert workloads[1].split() == ["deployment/nginx", "10", placed, "0"]
    assert workloads[2] == (
        f"pod/picky          1      <none>      1         Unschedulable: {pending_reason}"
    )

    as_json = status(testbed, "-n", NAMESPACE, "-o", "json")
    assert as_json.returncode == 3
    report = json.loads(as_json.stdout)
    assert (report["version"], report["context"], report["namespace"]) == (1, SOURCE, NAMESPACE)
    assert report["ready"] is False
    by_name = {t["name"]: t for t in report["targets"]}
    assert {n: (t["ready"], t["reason"]) for n, t in by_name.items()} == {
        "c1": (True, "Ready"),
        "c2": (True, "Ready"),
        "c3": (False, "Unreachable"),
    }
    assert by_name["c1"]["self"] is True
    for name, node in (("c1", C1), ("c2", C2)):
        virtual = by_name[name]["virtualNode"]
        real = kubectl.json(SOURCE, "get", "node", node)
        assert virtual["allocatable"] == real["status"]["allocatable"]
        assert virtual["proxyPods"] == per_node[node]
        assert virtual["requested"]["memory"] == f"{32 * per_node[node]}Mi"
    nginx_entry, picky_entry = report["workloads"]
    assert (nginx_entry["kind"], nginx_entry["name"], nginx_entry["pods"]) == (
        "Deployment",
        "nginx",
        10,
    )
    assert {p["target"]["name"]: p["pods"] for p in nginx_entry["placed"]} == {
        "c1": per_node[C1],
        "c2": per_node[C2],
    }
    assert picky_entry["pendingReasons"] == [
        {"reason": "Unschedulable", "message": pending_reason, "pods": 1}
    ]
    as_yaml = status(testbed, "-n", NAMESPACE, "-o", "yaml")
    assert yaml.safe_load(as_yaml.stdout)["workloads"] == report["workloads"]

    everywhere = status(testbed, "-A")
    assert everywhere.returncode == 3
    assert everywhere.stdout.splitlines()[0].split()[:2] == ["NAMESPACE", "TARGET"]
    rows = [line.split()[:3] for line in everywhere.stdout.splitlines()]
    assert [NAMESPACE, "deployment/nginx", "10"] in rows

    plugin_env = dict(os.environ) | {
        "KUBECONFIG": str(testbed.kubeconfig),
        "PATH": f"{VENV_BIN}{os.pathsep}{testbed.bin_dir}{os.pathsep}/usr/bin:/bin",
    }
    plugin = subprocess.run(
        [str(testbed.bin_dir / "kubectl"), *STATUS_ARGS],
        capture_output=True,
        text=True,
        env=plugin_env,
        timeout=60,
    )
    print(f"$ kubectl multicluster status --context {SOURCE} -n {NAMESPACE}\n{plugin.stdout}")
    assert plugin.returncode == 3, plugin.stderr
    assert plugin.stdout == proc.stdout
    helped = subprocess.run(
        [str(testbed.bin_dir / "kubectl"), "multicluster", "status", "--help"],
        capture_output=True,
        text=True,
        env=plugin_env,
        timeout=60,
    )
    assert helped.stdout.startswith("usage: kubectl multicluster status")
    plugins = subprocess.run(
        [str(testbed.bin_dir / "kubectl"), "plugin", "list"],
        capture_output=True,
        text=True,
        env=plugin_env,
        timeout=60,
    )
    assert str(VENV_BIN / "kubectl-multicluster") in plugins.stdout

    coloured = on_a_terminal(testbed, {})
    assert "\033[31mFalse\033[0m" in coloured
    assert "\033[33m1\033[0m" in coloured
    assert "\033[" not in on_a_terminal(testbed, {"NO_COLOR": "1"})


def on_a_terminal(testbed: TestBed, env: dict[str, str]) -> str:
    """What status prints when its stdout is a terminal."""
    leader, follower = pty.openpty()
    try:
        subprocess.run(
            [sys.executable, "-m", "multicluster_scheduler.cli", *STATUS_ARGS[1:]],
            stdout=follower,
            stderr=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if k != "NO_COLOR"}
            | {"KUBECONFIG": str(testbed.kubeconfig), "PYTHONPATH": str(ROOT)}
            | env,
            timeout=60,
            check=False,
        )
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(leader)


TENANT_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "Role",
    "metadata": {"name": "tenant", "namespace": NAMESPACE},
    "rules": [
        {"apiGroups": ["multicluster.admiralty.io"], "resources": ["targets"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ],
}


def tenant_kubeconfig(kubectl: Kubectl, testbed: TestBed, directory: Path) -> Path:
    """A context of service account web/tenant, who may list Targets and pods in web only."""
    kubectl(SOURCE, "create", "serviceaccount", "tenant", "-n", NAMESPACE)
    kubectl.apply(SOURCE, TENANT_ROLE)
    kubectl(
        SOURCE,
        "create",
        "rolebinding",
        "tenant",
        "-n",
        NAMESPACE,
        "--role",
        "tenant",
        f"--serviceaccount={NAMESPACE}:tenant",
    )
    token = kubectl(SOURCE, "create", "token", "tenant", "-n", NAMESPACE).strip()
    ca = directory / "ca.crt"
    ca.write_bytes(testbed[SOURCE].ca.cert_pem)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": SOURCE,
                "cluster": {"server": testbed[SOURCE].server, "certificate-authority": str(ca)},
            }
        ],
        "users": [{"name": "tenant", "user": {"token": token}}],
        "contexts": [
            {
                "name": "tenant",
                "context": {"cluster": SOURCE, "user": "tenant", "namespace": NAMESPACE},
            }
        ],
        "current-context": "tenant",
    }
    path = directory / "kubeconfig"
    path.write_text(json.dumps(config))
    return path


def test_a_tenant_sees_its_namespace_and_is_told_what_it_may_not_read(
    scene, testbed: TestBed, kubectl: Kubectl, tmp_path: Path
):
    config = tenant_kubeconfig(kubectl, testbed, tmp_path)
    proc = cli(config, "status")  # the context's namespace: web
    assert proc.returncode == 3
    warnings = proc.stderr.splitlines()
    assert len(warnings) == 4
    assert warnings[0].startswith("warning: cannot list ClusterTargets in context tenant (403")
    assert warnings[1].startswith("warning: cannot list nodes in context tenant (403 Forbidden")
    assert warnings[1].endswith("nor whether an agent keeps them")
    assert warnings[2].startswith(f"warning: cannot read namespace {NAMESPACE} (403 Forbidden")
    assert warnings[2].endswith("): whether it is enabled is not said")
    assert warnings[3].startswith(f"warning: cannot read ReplicaSet {NAMESPACE}/nginx-")
    assert "(403 Forbidden: " in warnings[3]
    assert warnings[3].endswith("): pods of such ReplicaSets are counted by ReplicaSet")
    lines = proc.stdout.splitlines()
    assert lines[1].split()[:5] == ["c1", "True", "Ready", C1, "?"]
    assert any(line.startswith("replicaset/nginx-") for line in lines)

    refused = cli(config, "status", "-A")
    assert refused.returncode == 1
    assert refused.stdout == ""
    assert refused.stderr.startswith(
        f"error: cannot list Targets in all namespaces: context tenant ({testbed[SOURCE].server})"
        " does not allow it (403 Forbidden): "
    )


def test_a_missing_namespace_or_context_is_an_error_that_names_it(scene, testbed: TestBed):
    proc = status(testbed, "-n", "nowhere")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == f"error: namespace nowhere does not exist in context {SOURCE}\n"
    proc = cli(testbed.kubeconfig, "status", "--context", "cluster9")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: context 'cluster9' is not in the kubeconfig")
